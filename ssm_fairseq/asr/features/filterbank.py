"""Log-Mel filterbanks chunk by chunk: the frames ``ssm_fairseq.asr.features.audio_features.log_mel_filterbank`` gives
on the
whole waveform, emitted as soon as their window has arrived.

The offline features are torchaudio's Kaldi-compatible ``fbank`` with ``snip_edges``: frame ``i`` covers samples
``[160 i, 160 i + 400)`` (25 ms window, 10 ms shift at 16 kHz), and each frame depends on its own window only
(dither 0; DC removal, pre-emphasis and the Povey window are per frame). So a ``StreamingFilterbank`` keeps the
samples of the frames whose window is not complete yet (fewer than 400 + one chunk), computes the complete ones
with ``log_mel_filterbank`` itself, and drops the samples no later frame needs. The frames equal the offline ones
up to float32 rounding (about 1e-6 on the log energies): the mel projection is one matrix product over all the
frames of a call, and the BLAS kernel it runs on depends on how many frames there are. Like offline, the samples
after the last complete window give no frame (there is no flush), and audio shorter than one window gives none.

Input is 16 kHz mono float samples in [-1, 1] (``ssm_fairseq.asr.features.audio_features.to_16k_mono`` converts other
audio
offline). Imports only numpy, torch and ``ssm_fairseq.asr.features.audio_features``.
"""
from __future__ import annotations

import numpy as np
import torch

from ssm_fairseq.asr.features.audio_features import (FRAME_SHIFT_SAMPLES,
    MIN_SAMPLES, NUM_MEL_BINS, SAMPLE_RATE, log_mel_filterbank)


class StreamingFilterbank:
    """80-dim log-Mel filterbanks of a 16 kHz mono stream, fed chunk by chunk.

    >>> fbank = StreamingFilterbank()
    >>> frames = [fbank.accept_waveform(chunk) for chunk in chunks]  # each ``n x 80`` float32, n >= 0
    >>> np.concatenate(frames)  # == log_mel_filterbank(np.concatenate(chunks), 16000), to ~1e-6

    One instance per utterance (or call ``reset``). State: the samples not yet consumed by a complete frame
    (``pending_samples``, always fewer than 400 after a call returns) and the count of frames emitted.
    """

    sample_rate = SAMPLE_RATE  # Hz, the only rate accepted
    num_mel_bins = NUM_MEL_BINS
    window_samples = MIN_SAMPLES  # 25 ms
    shift_samples = FRAME_SHIFT_SAMPLES  # 10 ms

    def __init__(self) -> None:
        self._buffer = np.zeros(0, dtype=np.float32)  # samples from the start of the next frame's window on
        self._frames = 0  # frames emitted

    @property
    def frames_emitted(self) -> int:
        """Frames returned so far: the next frame ``accept_waveform`` returns is offline frame ``frames_emitted``."""
        return self._frames

    @property
    def samples_accepted(self) -> int:
        """Samples accepted so far (all chunks together)."""
        return self._frames * self.shift_samples + self._buffer.shape[0]

    @property
    def pending_samples(self) -> int:
        """Samples kept for the frames not complete yet (fewer than ``window_samples`` between calls)."""
        return self._buffer.shape[0]

    def reset(self) -> None:
        """Forget the stream: the next sample accepted is the first of a new utterance."""
        self._buffer = np.zeros(0, dtype=np.float32)
        self._frames = 0

    def accept_waveform(self, samples: np.ndarray | torch.Tensor) -> np.ndarray:
        """The next ``samples`` (1-D, float, 16 kHz mono, in [-1, 1]; any length, 0 included) -> the frames that
        became complete, ``n x 80`` float32 (``n`` may be 0), in order, continuing the previous calls' frames.

        Raises ``ValueError`` (and keeps its state) for samples that are not a 1-D float array or hold NaN or inf.
        """
        chunk = self._validated(samples)
        buffer = np.concatenate([self._buffer, chunk]) if self._buffer.size else chunk
        if buffer.shape[0] < self.window_samples:
            self._buffer = np.array(buffer)  # a copy: never the caller's array
            return np.zeros((0, self.num_mel_bins), dtype=np.float32)
        count = 1 + (buffer.shape[0] - self.window_samples) // self.shift_samples
        covered = (count - 1) * self.shift_samples + self.window_samples
        frames = log_mel_filterbank(buffer[:covered], self.sample_rate).astype(np.float32, copy=False)
        if frames.shape != (count, self.num_mel_bins):  # log_mel_filterbank's framing is ours: a guard, not a case
            raise RuntimeError(f"log_mel_filterbank gave {frames.shape} frames for {covered} samples, "
                               f"expected ({count}, {self.num_mel_bins})")
        self._buffer = buffer[count * self.shift_samples:].copy()  # a copy: the large chunk is not kept alive
        self._frames += count
        return frames

    def _validated(self, samples) -> np.ndarray:
        """``samples`` as a 1-D float32 array, or ``ValueError`` saying what is wrong with them."""
        if isinstance(samples, torch.Tensor):  # any device; float16 / bfloat16 (which numpy lacks) as float32
            samples = samples.detach().cpu()
            samples = (samples.float() if samples.is_floating_point() else samples).numpy()
        array = np.asarray(samples)
        if array.ndim != 1:
            raise ValueError(f"StreamingFilterbank.accept_waveform takes 1-D mono samples, got shape "
                             f"{tuple(array.shape)} (downmix channels and pass one chunk of samples at a time)")
        if not np.issubdtype(array.dtype, np.floating):
            raise ValueError(f"StreamingFilterbank.accept_waveform takes float samples in [-1, 1], got {array.dtype}"
                             + (" (16-bit PCM: divide by 32768)" if np.issubdtype(array.dtype, np.integer) else ""))
        array = array.astype(np.float32, copy=False)
        if not np.isfinite(array).all():
            bad = int(np.flatnonzero(~np.isfinite(array))[0])
            raise ValueError(f"StreamingFilterbank.accept_waveform: non-finite sample ({array[bad]}) at index {bad} "
                             f"of the chunk (stream sample {self.samples_accepted + bad})")
        return array
