"""The data directory's feature transforms at recognition time: applied to filterbanks and checked finite (offline
files and stream chunks alike), whether they can run chunk by chunk, a stream's own state of them
(``FeatureStream``), and the decode-time replacement of the config's CMVN (``decoding_transforms``)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from fairseq.data.audio.feature_transforms import CompositeAudioFeatureTransform
from fairseq.data.audio.feature_transforms.global_cmvn import GlobalCMVN

from .adaptive_cmvn import AdaptiveCMVN, check_prior_frames
from .audio_features import NUM_MEL_BINS

PER_FRAME_TRANSFORMS = ("GlobalCMVN",)  # feature transforms that treat every frame alone: they can stream
# transforms whose frame t depends on the stream's frames up to t: they stream with a state per stream (FeatureStream)
CAUSAL_TRANSFORMS = ("AdaptiveCMVN",)
CMVN_TRANSFORMS = ("GlobalCMVN", "UtteranceCMVN", "AdaptiveCMVN")  # what decoding_transforms replaces


class NonFiniteFeaturesError(ValueError):
    """Features with NaN or inf after the config's transforms (NaN or inf in the audio, or made by a transform)."""


def transformed(transforms: CompositeAudioFeatureTransform | FeatureStream | None, features: np.ndarray
                ) -> np.ndarray:
    """``T x 80`` filterbanks (``T`` may be 0) -> the ``T x 80`` features the model saw in training, through
    ``transforms`` (the config's for evaluation splits: one whole utterance; or a stream's ``FeatureStream``: its
    next chunk); ``NonFiniteFeaturesError`` unless all are finite."""
    if transforms is not None and len(features):
        features = transforms(features)
    if not np.isfinite(features).all():
        raise NonFiniteFeaturesError("features are not finite (NaN or inf in the audio)")
    return features


class FeatureStream:
    """One stream's feature transforms: ``transforms``' steps applied to its chunks in order, per-frame ones as they
    are and causal ones (``AdaptiveCMVN``) through a state of this stream's own (``AdaptiveCMVN.stream()``), so
    that the chunks' outputs, joined, are the transforms' output on the whole stream. One per stream and utterance
    (a new one starts the statistics afresh). ``ValueError`` (``streaming_transform_problem``) for transforms that
    need the whole utterance.

    >>> features = FeatureStream(recognizer.feature_transforms)
    >>> np.concatenate([transformed(features, chunk) for chunk in chunks])  # == transformed(transforms, whole)
    """

    def __init__(self, transforms: CompositeAudioFeatureTransform | None):
        problem = streaming_transform_problem(transforms, per_stream_state=True)
        if problem:
            raise ValueError(problem)
        steps = [] if transforms is None else transforms.transforms
        self.steps = [step.stream() if type(step).__name__ in CAUSAL_TRANSFORMS else step for step in steps]

    def __call__(self, features: np.ndarray) -> np.ndarray:
        """The stream's next ``T x 80`` frames -> its next ``T x 80`` transformed frames."""
        for step in self.steps:
            features = step(features)
        return features


def streaming_transform_problem(transforms: CompositeAudioFeatureTransform | None, per_stream_state: bool = False
                                ) -> str | None:
    """Why ``transforms`` cannot run chunk by chunk (one needs the whole utterance, as utterance CMVN), or None.
    Causal transforms (adaptive CMVN) can, for a caller that keeps a ``FeatureStream`` per stream
    (``per_stream_state``); applied to each chunk alone they would start their statistics afresh at every chunk."""
    for transform in [] if transforms is None else transforms.transforms:
        name = type(transform).__name__
        if name in CAUSAL_TRANSFORMS and not per_stream_state:
            return (f"the feature transforms apply {name}, which keeps statistics per stream: this caller transforms "
                    "chunks without a stream's state (features.transforms.FeatureStream)")
        if name not in PER_FRAME_TRANSFORMS + CAUSAL_TRANSFORMS:
            return (f"the data directory's config.yaml applies {name}, which needs the whole "
                    "utterance: streaming needs per-frame transforms (prepare the data with --cmvn global, and "
                    "train on it)")
    return None


def load_global_cmvn(path: Path | str) -> GlobalCMVN:
    """fairseq's ``GlobalCMVN`` with the statistics of ``path`` (an ``.npz`` with ``mean`` and ``std``, ``80``
    each: ``gcmvn.npz`` of ``ssm-prepare-librispeech --cmvn global``); ``FileNotFoundError`` or ``ValueError``
    naming the file if it is missing or not such statistics."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: CMVN statistics not found (a gcmvn.npz, as ssm-prepare-librispeech "
                                "--cmvn global writes into its data directory)")
    try:
        with np.load(path) as stats:
            mean, std = (np.asarray(stats[key]) for key in ("mean", "std"))
    except Exception as error:  # not a zip, not numpy, a key missing: numpy raises several types
        raise ValueError(f"{path}: not CMVN statistics (an .npz with mean and std): {error}") from error
    for name, values in (("mean", mean), ("std", std)):
        if values.shape != (NUM_MEL_BINS,) or not np.isfinite(values).all():
            raise ValueError(f"{path}: {name} must be {NUM_MEL_BINS} finite numbers, got shape {values.shape}"
                             + ("" if np.isfinite(values).all() else " with NaN or inf"))
    if (std <= 0).any():
        raise ValueError(f"{path}: std must be above 0 in every bin (bin {int(np.argmax(std <= 0))}: {std.min()})")
    return GlobalCMVN(str(path))


def decoding_transforms(transforms: CompositeAudioFeatureTransform | None, cmvn_stats: Path | str | None = None,
                        cmvn_adapt_frames: float | None = None) -> CompositeAudioFeatureTransform | None:
    """The config's feature transforms with its CMVN replaced as a decoding asks (``DecodingOptions.cmvn_stats``
    and ``cmvn_adapt_frames``); ``transforms`` itself when neither is given.

    ``cmvn_stats``: global CMVN with these statistics (``load_global_cmvn``) in place of the config's CMVN (global,
    utterance or adaptive). ``cmvn_adapt_frames``: adaptive CMVN (``AdaptiveCMVN``) with a prior of that many frames
    after the global CMVN (``cmvn_stats``'s, else the config's); ``inf`` is global CMVN alone. ``ValueError`` for an
    out-of-range weight, a config without CMVN to replace, or adaptation with neither global statistics."""
    if cmvn_stats is None and cmvn_adapt_frames is None:
        return transforms
    steps = [] if transforms is None else list(transforms.transforms)
    first, end = _cmvn_span(steps)
    if cmvn_stats is not None:
        global_cmvn = load_global_cmvn(cmvn_stats)
    elif isinstance(steps[first], GlobalCMVN):
        global_cmvn = steps[first]
    else:
        raise ValueError(f"adaptive CMVN starts from the training set's global statistics, and this data directory's "
                         f"config.yaml applies {type(steps[first]).__name__} without them: give them (cmvn_stats / "
                         f"--cmvn-stats: the gcmvn.npz of the same training audio)")
    replacement = [global_cmvn]
    if cmvn_adapt_frames is not None and not math.isinf(check_prior_frames(cmvn_adapt_frames)):
        replacement.append(AdaptiveCMVN(cmvn_adapt_frames))
    return CompositeAudioFeatureTransform(steps[:first] + replacement + steps[end:])


def _cmvn_span(steps: list) -> tuple[int, int]:
    """``[first, end)``: the steps of ``steps`` that are its CMVN: one CMVN transform, or global CMVN followed by
    adaptive CMVN; ``ValueError`` naming the steps for none or any other arrangement."""
    names = [type(step).__name__ for step in steps]
    cmvn = [n for n, name in enumerate(names) if name in CMVN_TRANSFORMS]
    if len(cmvn) == 1:
        return cmvn[0], cmvn[0] + 1
    if len(cmvn) == 2 and names[cmvn[0]:cmvn[1] + 1] == ["GlobalCMVN", "AdaptiveCMVN"]:
        return cmvn[0], cmvn[1] + 1
    raise ValueError(f"the data directory's feature transforms {names}: replacing the CMVN at decoding time needs one "
                     "CMVN transform (global, utterance or adaptive) or global CMVN followed by adaptive CMVN")
