"""Streaming-adaptive CMVN: each frame normalised by statistics that follow the stream, starting from the training
set's.

Applied after global CMVN (``global_cmvn``, the training set's mean and std per bin), whose output has, over the
training set, mean 0 and variance 1 in every bin. A speaker or channel the training set lacks gives frames whose
mean and variance are not 0 and 1; adaptive CMVN moves them there as the stream goes on, without looking ahead.
Frame ``t`` (0-based) of a stream ``y_0, y_1, ...`` (each ``80`` bins, already globally normalised) becomes

    mean_t = (sum_{i<=t} y_i) / (N + t + 1)                 # the prior: N frames of mean 0 ...
    var_t  = (N + sum_{i<=t} y_i^2) / (N + t + 1) - mean_t^2  # ... and variance 1
    out_t  = (y_t - mean_t) / sqrt(max(var_t, 1e-10))

per bin: the running mean and variance of the frames so far, pooled with ``N`` (``prior_frames``) frames of the
training set's statistics. At ``t = 0`` the statistics are nearly the prior's; after many more than ``N`` frames,
nearly the stream's own (utterance CMVN of what was heard so far). Because global CMVN is affine per bin and the prior
is the training statistics mapped through it, this is exactly the same running CMVN on the raw filterbanks with the
prior ``N`` frames of the training mean and variance: applying it after ``global_cmvn`` needs no statistics of its
own. ``N = inf`` leaves the frames as they are (global CMVN alone); ``N = 0`` is causal utterance CMVN (frame 0
becomes 0). The floor ``1e-10`` on the variance is fairseq's ``UtteranceCMVN``'s.

Frame ``t`` depends on frames ``<= t`` only, so a stream is normalised chunk by chunk (``RunningCMVN``, one per
stream, carrying the sums and the frame count) with exactly the offline result (fairseq's transform
``adaptive_cmvn.AdaptiveCMVN``: a fresh ``RunningCMVN`` over the whole utterance), bit for bit, at any chunk sizes:
the sums are kept in float64 and extended with numpy's ``cumsum`` (a sequential accumulation) from the sums so far,
and the rest is per frame.

Numpy only: data preparation reads ``ADAPTIVE_CMVN`` and ``check_prior_frames`` from here without fairseq.
"""
from __future__ import annotations

import math

import numpy as np

VARIANCE_FLOOR = 1e-10  # fairseq's UtteranceCMVN's
ADAPTIVE_CMVN = "adaptive_cmvn"  # the name of the fairseq transform (adaptive_cmvn.py) in a config.yaml


def check_prior_frames(prior_frames) -> float:
    """``prior_frames`` as a float: a number of frames ``>= 0``, or ``inf``; ``ValueError`` naming it otherwise."""
    if isinstance(prior_frames, bool) or not isinstance(prior_frames, (int, float, np.integer, np.floating)) \
            or math.isnan(prior_frames) or prior_frames < 0:
        raise ValueError(f"adaptive CMVN's prior_frames must be a number of frames >= 0 (or inf: global CMVN alone), "
                         f"got {prior_frames!r}")
    return float(prior_frames)


class RunningCMVN:
    """One stream's adaptive CMVN (see the module's docstring): ``T x D`` globally normalised frames in, chunk by
    chunk, ``T x D`` float32 frames out, each normalised by the statistics of the frames up to it.

    >>> running = RunningCMVN(prior_frames=300)
    >>> np.concatenate([running(chunk) for chunk in chunks])  # == AdaptiveCMVN(300)(np.concatenate(chunks))

    State: the frames seen (``frames``) and, once a frame has come, the float64 sums of the frames and of their
    squares per bin (``D`` each). ``ValueError`` (the state unchanged) for frames that are not ``T x D`` with the
    stream's ``D``.
    """

    def __init__(self, prior_frames: float):
        self.prior_frames = check_prior_frames(prior_frames)
        self.frames = 0
        self._sums: np.ndarray | None = None  # 2 x D float64: sum of frames, sum of squares (the prior's N too)

    def __call__(self, features: np.ndarray) -> np.ndarray:
        """The stream's next ``T x D`` frames (``T`` may be 0) -> the ``T x D`` float32 frames normalised."""
        features = np.asarray(features)
        if features.ndim != 2 or (self._sums is not None and features.shape[1] != self._sums.shape[1]):
            expected = "T x D frames" if self._sums is None else \
                f"T x {self._sums.shape[1]} frames, as the stream's earlier frames"
            raise ValueError(f"adaptive CMVN takes {expected}, got shape {tuple(features.shape)}")
        if not len(features):
            return features.astype(np.float32)
        frames = features.astype(np.float64)
        if math.isinf(self.prior_frames):  # the prior outweighs any stream: global CMVN alone
            self.frames += len(frames)
            return frames.astype(np.float32)
        if self._sums is None:
            self._sums = np.stack([np.zeros(frames.shape[1]), np.full(frames.shape[1], self.prior_frames)])
        sums = np.cumsum(np.concatenate([self._sums[:1], frames]), axis=0)[1:]
        squares = np.cumsum(np.concatenate([self._sums[1:], frames * frames]), axis=0)[1:]
        counts = self.prior_frames + np.arange(self.frames + 1, self.frames + len(frames) + 1, dtype=np.float64)
        mean = sums / counts[:, None]
        variance = squares / counts[:, None] - mean * mean
        normalised = (frames - mean) / np.sqrt(np.maximum(variance, VARIANCE_FLOOR))
        self._sums = np.stack([sums[-1], squares[-1]])
        self.frames += len(frames)
        return normalised.astype(np.float32)

    @property
    def mean(self) -> np.ndarray | None:
        """The pooled mean per bin after the frames so far (``D``), None before the first frame (or with an
        infinite prior, which never moves from 0)."""
        return None if self._sums is None else self._sums[0] / (self.prior_frames + self.frames)

    @property
    def variance(self) -> np.ndarray | None:
        """The pooled variance per bin after the frames so far (``D``), unfloored; None as ``mean``."""
        mean = self.mean
        return None if mean is None else self._sums[1] / (self.prior_frames + self.frames) - mean * mean
