"""What a stream accepts: chunk lengths in milliseconds, and float samples in [-1, 1]."""
from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from .features.audio_features import SAMPLE_RATE


class SampleRangeError(ValueError):
    """Float samples outside [-1, 1] (e.g. 16-bit PCM values as floats, not divided by 32768)."""


def chunk_samples(chunk_ms: float) -> int:
    """Samples in a chunk of ``chunk_ms`` milliseconds at 16 kHz (rounded, at least one); ``ValueError`` unless
    ``chunk_ms`` is a positive finite number."""
    if isinstance(chunk_ms, bool) or not isinstance(chunk_ms, numbers.Real):
        raise ValueError(f"chunk_ms must be a number of milliseconds, got {chunk_ms!r}")
    if not (math.isfinite(chunk_ms) and chunk_ms > 0):
        raise ValueError(f"chunk_ms must be a positive, finite number of milliseconds, got {chunk_ms}")
    return max(1, round(chunk_ms * SAMPLE_RATE / 1000))


def check_sample_range(samples: np.ndarray | torch.Tensor, stream_sample: int) -> None:
    """``SampleRangeError`` naming the peak if 1-D, finite float ``samples`` go beyond [-1, 1] (``stream_sample``:
    the stream's count of samples before them). Anything else (integers, other shapes, NaN) is left to the
    filterbank, which names it."""
    if isinstance(samples, torch.Tensor):
        samples = samples.detach().cpu()
        samples = samples.float().numpy() if samples.is_floating_point() else samples.numpy()
    array = np.asarray(samples)
    if array.ndim != 1 or not array.size or not np.issubdtype(array.dtype, np.floating):
        return
    magnitudes = np.abs(array)
    if not np.isfinite(magnitudes).all() or magnitudes.max() <= 1.0:
        return
    peak = int(magnitudes.argmax())
    raise SampleRangeError(f"accept_waveform takes float samples in [-1, 1]; this chunk reaches {array[peak]:g} "
                           f"(at stream sample {stream_sample + peak}): samples at 16-bit scale? divide them by "
                           "32768")
