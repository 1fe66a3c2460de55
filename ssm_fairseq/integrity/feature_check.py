"""Utterances whose features hold NaN or inf, found in a batch before the model sees it.

A non-finite input cannot be trained on or decoded. Training leaves it out (the ``transducer`` criterion zeroes
it and scores it in no loss: even an excluded utterance would put ``0 * NaN`` into the weight gradients), and
decoding stops naming it (``SpeechTransducerTask.inference_step``), so that no WER includes a garbage hypothesis.
"""
from __future__ import annotations

import torch
from torch import Tensor


def non_finite_utterances(features: Tensor, lengths: Tensor) -> Tensor:
    """``B`` bools: the utterances of ``B x T x F`` features with a NaN or inf within their ``B`` lengths."""
    padded = torch.arange(features.shape[1], device=features.device) >= lengths.to(features.device)[:, None]
    return ~(features.isfinite().all(-1) | padded).all(-1)
