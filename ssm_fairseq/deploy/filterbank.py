"""The project's 80-dim log-Mel filterbanks in numpy alone: what ``ssm_fairseq.asr.features.audio_features`` computes
with torchaudio's Kaldi-compatible ``fbank``, for a runtime without torch.

The settings are ``audio_features``' (25 ms Povey window, 10 ms shift, 512-point FFT, power spectrum, 80 Kaldi mel
bins from 20 Hz to Nyquist, pre-emphasis 0.97, DC removal per frame, no dither, ``snip_edges``: frame ``i`` covers
samples ``[160 i, 160 i + 400)``), on samples scaled to 16-bit range. Arithmetic is float64 and the result float32;
torch computes in float32, so the two differ by torch's rounding (below 1e-4 on speech; a mel bin whose energy is
many orders of magnitude below the frame's loudest can differ more, as float32 spectra do).

``StreamingFilterbank`` emits the same frames chunk by chunk as soon as each frame's window has arrived, as
``ssm_fairseq.asr.features.filterbank.StreamingFilterbank`` does. Imports numpy only.
"""
from __future__ import annotations

import math

import numpy as np

SAMPLE_RATE = 16000
NUM_MEL_BINS = 80
WINDOW_SAMPLES = 400  # 25 ms
SHIFT_SAMPLES = 160  # 10 ms
FFT_SIZE = 512  # the window rounded up to a power of two
PREEMPHASIS = 0.97
LOW_FREQ = 20.0
PCM_SCALE = 32768.0  # samples in [-1, 1] are scaled to 16-bit range, as audio_features does
FLOAT32_EPSILON = float(np.finfo(np.float32).eps)  # the floor of the mel energies before the log


def _mel(freq):
    return 1127.0 * np.log(1.0 + np.asarray(freq, dtype=np.float64) / 700.0)


def mel_banks(num_bins: int = NUM_MEL_BINS, fft_size: int = FFT_SIZE, sample_rate: int = SAMPLE_RATE,
              low_freq: float = LOW_FREQ) -> np.ndarray:
    """Kaldi's triangular mel filters: ``num_bins x (fft_size / 2 + 1)`` (the Nyquist bin's column is zero)."""
    nyquist = sample_rate / 2
    mel_low, mel_high = _mel(low_freq), _mel(nyquist)
    delta = (mel_high - mel_low) / (num_bins + 1)
    bins = np.arange(num_bins, dtype=np.float64)[:, None]
    left, center, right = mel_low + bins * delta, mel_low + (bins + 1) * delta, mel_low + (bins + 2) * delta
    mel = _mel(sample_rate / fft_size * np.arange(fft_size // 2))[None, :]
    weights = np.maximum(0.0, np.minimum((mel - left) / (center - left), (right - mel) / (right - center)))
    return np.pad(weights, ((0, 0), (0, 1)))


def povey_window(size: int = WINDOW_SAMPLES) -> np.ndarray:
    """Kaldi's Povey window: a symmetric Hann window to the power 0.85."""
    n = np.arange(size, dtype=np.float64)
    return (0.5 - 0.5 * np.cos(2 * math.pi * n / (size - 1))) ** 0.85


_MEL_BANKS = mel_banks()
_WINDOW = povey_window()


def frame_count(num_samples: int) -> int:
    """Filterbank frames of ``num_samples`` 16 kHz samples (0 below one window)."""
    return 0 if num_samples < WINDOW_SAMPLES else 1 + (num_samples - WINDOW_SAMPLES) // SHIFT_SAMPLES


def log_mel_filterbank(samples: np.ndarray) -> np.ndarray:
    """``n`` 16 kHz mono samples in [-1, 1] -> ``T x 80`` float32 log-Mel filterbanks, ``T = frame_count(n)``."""
    samples = np.asarray(samples, dtype=np.float64) * PCM_SCALE
    count = frame_count(samples.shape[0])
    if count == 0:
        return np.zeros((0, NUM_MEL_BINS), dtype=np.float32)
    starts = np.arange(count)[:, None] * SHIFT_SAMPLES
    frames = samples[starts + np.arange(WINDOW_SAMPLES)]  # T x 400
    frames = frames - frames.mean(axis=1, keepdims=True)
    previous = np.concatenate([frames[:, :1], frames[:, :-1]], axis=1)  # x[j - 1], x[0] for j = 0
    frames = (frames - PREEMPHASIS * previous) * _WINDOW
    power = np.abs(np.fft.rfft(frames, n=FFT_SIZE, axis=1)) ** 2  # T x 257
    energies = power @ _MEL_BANKS.T
    return np.log(np.maximum(energies, FLOAT32_EPSILON)).astype(np.float32)


class StreamingFilterbank:
    """80-dim log-Mel filterbanks of a 16 kHz mono stream, fed chunk by chunk: ``accept_waveform`` returns the
    frames whose window is complete (``n x 80`` float32, ``n >= 0``); over a stream they are
    ``log_mel_filterbank`` of all its samples. State: the samples of the frames not complete yet."""

    def __init__(self) -> None:
        self._buffer = np.zeros(0, dtype=np.float32)  # samples from the start of the next frame's window on
        self._frames = 0

    @property
    def samples_accepted(self) -> int:
        return self._frames * SHIFT_SAMPLES + self._buffer.shape[0]

    def accept_waveform(self, samples: np.ndarray) -> np.ndarray:
        """The next 1-D float samples (any length) -> the ``n x 80`` frames they complete. ``ValueError`` (state
        kept) for samples that are not 1-D floats or not finite."""
        chunk = np.asarray(samples)
        if chunk.ndim != 1 or not np.issubdtype(chunk.dtype, np.floating):
            raise ValueError(f"accept_waveform takes 1-D float samples in [-1, 1], got {chunk.dtype} of shape "
                             f"{tuple(chunk.shape)}")
        if not np.isfinite(chunk).all():
            raise ValueError(f"non-finite sample in the chunk (stream sample "
                             f"{self.samples_accepted + int(np.flatnonzero(~np.isfinite(chunk))[0])})")
        buffer = np.concatenate([self._buffer, chunk.astype(np.float32, copy=False)])
        count = frame_count(buffer.shape[0])
        frames = log_mel_filterbank(buffer[:(count - 1) * SHIFT_SAMPLES + WINDOW_SAMPLES] if count else buffer[:0])
        self._buffer = buffer[count * SHIFT_SAMPLES:].copy()
        self._frames += count
        return frames
