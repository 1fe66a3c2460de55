"""fairseq's feature transform ``adaptive_cmvn``: streaming-adaptive CMVN (``running_cmvn``: each frame normalised by
statistics that follow the stream, starting from the training set's) as a step of a data directory's transforms.

In a data directory's ``config.yaml`` (fairseq's feature-transform configuration; the module is imported, and
``adaptive_cmvn`` registered, with the package's other fairseq components)::

    feature_transforms:
      '*': [global_cmvn, adaptive_cmvn]
      _train: [global_cmvn, adaptive_cmvn]
    global_cmvn: {stats_npz_path: gcmvn.npz}
    adaptive_cmvn: {prior_frames: 300}

Each utterance then starts from the training statistics (in training too: fairseq applies the transforms per
utterance). At decoding time ``DecodingOptions(cmvn_adapt_frames=N)`` (``ssm-transcribe --cmvn-adapt N``) adds it
after the config's global CMVN (``features.transforms.decoding_transforms``).
"""
from __future__ import annotations

import numpy as np
from fairseq.data.audio.feature_transforms import AudioFeatureTransform, register_audio_feature_transform

from .running_cmvn import ADAPTIVE_CMVN, RunningCMVN, check_prior_frames

__all__ = ["ADAPTIVE_CMVN", "AdaptiveCMVN", "RunningCMVN", "check_prior_frames"]


@register_audio_feature_transform(ADAPTIVE_CMVN)
class AdaptiveCMVN(AudioFeatureTransform):
    """fairseq's feature transform ``adaptive_cmvn``: one utterance, ``T x D`` globally normalised frames, through a
    fresh ``RunningCMVN`` (its statistics start from the prior at the utterance's first frame). ``stream()`` gives
    the state for a stream fed chunk by chunk. Config: ``prior_frames`` (required; ``ValueError`` if missing or
    out of range)."""

    @classmethod
    def from_config_dict(cls, config=None):
        config = {} if config is None else config
        if "prior_frames" not in config:
            raise ValueError("config.yaml's adaptive_cmvn section needs prior_frames: the weight, in frames, of the "
                             "training set's statistics that each utterance's statistics start from")
        return cls(config["prior_frames"])

    def __init__(self, prior_frames: float):
        self.prior_frames = check_prior_frames(prior_frames)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(prior_frames={self.prior_frames:g})"

    def stream(self) -> RunningCMVN:
        """A new stream's state: its frames go through it chunk by chunk."""
        return RunningCMVN(self.prior_frames)

    def __call__(self, features: np.ndarray) -> np.ndarray:
        return self.stream()(features)
