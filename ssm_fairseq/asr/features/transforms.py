"""The data directory's feature transforms at recognition time: applied to filterbanks and checked finite (offline
files and stream chunks alike), and whether they can run chunk by chunk."""
from __future__ import annotations

import numpy as np
from fairseq.data.audio.feature_transforms import CompositeAudioFeatureTransform

PER_FRAME_TRANSFORMS = ("GlobalCMVN",)  # feature transforms that treat every frame alone: they can stream


class NonFiniteFeaturesError(ValueError):
    """Features with NaN or inf after the config's transforms (NaN or inf in the audio, or made by a transform)."""


def transformed(transforms: CompositeAudioFeatureTransform | None, features: np.ndarray) -> np.ndarray:
    """``T x 80`` filterbanks (``T`` may be 0) -> the ``T x 80`` features the model saw in training, through
    ``transforms`` (the config's for evaluation splits); ``NonFiniteFeaturesError`` unless all are finite."""
    if transforms is not None and len(features):
        features = transforms(features)
    if not np.isfinite(features).all():
        raise NonFiniteFeaturesError("features are not finite (NaN or inf in the audio)")
    return features


def streaming_transform_problem(transforms: CompositeAudioFeatureTransform | None) -> str | None:
    """Why ``transforms`` cannot run chunk by chunk (one needs the whole utterance, as utterance CMVN), or None."""
    for transform in [] if transforms is None else transforms.transforms:
        if type(transform).__name__ not in PER_FRAME_TRANSFORMS:
            return (f"the data directory's config.yaml applies {type(transform).__name__}, which needs the whole "
                    "utterance: streaming needs per-frame transforms (prepare the data with --cmvn global, and "
                    "train on it)")
    return None
