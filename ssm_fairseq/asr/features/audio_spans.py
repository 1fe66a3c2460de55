"""Spans of an audio file as 16 kHz mono samples and their filterbank frames, each read without the rest of the file:
what transcribing a file of any length in bounded memory reads.

``AudioSpans(path).filterbank(start, end)`` is frames ``start`` to ``end`` of ``filterbank_features(path)`` up to
float32 rounding (about 1e-6 on the log energies, as ``StreamingFilterbank``'s frames are: the mel projection's BLAS
kernel depends on how many frames there are), and ``samples(start, end)`` is that slice of ``read_16k_mono(path)``.

A 16 kHz file's span is read as it is (channels averaged); another rate is read with a margin on each side and
resampled by ``to_16k_mono`` itself, then the margin's samples are dropped. The resampler (a windowed sinc applied as a
strided convolution) makes each block of ``new`` output samples from the ``old`` input samples of its block and
fewer than ``old`` on each side, where ``old / new`` is the rates' ratio in lowest terms; so a span whose blocks
start where the file's do and whose margin holds a whole block more than the filter reaches gives the whole file's
samples, up to float32 rounding.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import soundfile as sf

from .audio_features import (
    FRAME_SHIFT_SAMPLES, MIN_SAMPLES, NUM_MEL_BINS, SAMPLE_RATE, AudioError, audio_frames, check_float_scale,
    log_mel_filterbank, to_16k_mono,
)

# torchaudio's resampler reaches lowpass_filter_width / (rolloff * min(old, new)) blocks of ``old`` input samples to
# each side of an output block (6 / 0.99 at its defaults, which to_16k_mono uses); twice that, and a block more,
# is the margin read around a span
_FILTER_REACH = 2 * 6 / 0.99


class AudioSpans:
    """One audio file, read a span at a time.

    ``frames`` is the file's filterbank frame count (``audio_frames``), ``samples_16k`` its length at 16 kHz,
    ``duration`` its seconds, ``conversion`` what ``to_16k_mono`` converts (None for 16 kHz mono). Raises
    ``AudioError`` naming the file if it is missing, unreadable or shorter than one 25 ms window.
    """

    def __init__(self, path: Path | str):
        self.path = path
        self.frames = audio_frames(path)  # AudioError for a missing, unreadable or empty file
        info = sf.info(str(path))
        self.sample_rate, self.channels, self.file_samples = info.samplerate, info.channels, info.frames
        self.duration = info.frames / info.samplerate
        common = math.gcd(self.sample_rate, SAMPLE_RATE)
        self._old, self._new = self.sample_rate // common, SAMPLE_RATE // common  # block sizes, input and output
        self._margin_blocks = math.ceil(_FILTER_REACH / min(self._old, self._new)) + 1
        self.samples_16k = -(-self.file_samples * self._new // self._old)  # the resampler's output length
        self.conversion = to_16k_mono(np.zeros((self._old, self.channels), dtype=np.float32), self.sample_rate)[1]

    def samples(self, start: int, end: int) -> np.ndarray:
        """16 kHz mono samples ``start`` to ``end`` (clipped to the file), float32: ``read_16k_mono``'s slice."""
        start, end = max(0, start), min(end, self.samples_16k)
        if end <= start:
            return np.zeros(0, dtype=np.float32)
        first_block = max(0, start // self._new - self._margin_blocks)
        last_block = -(-end // self._new) + self._margin_blocks
        read_from, read_to = first_block * self._old, min(last_block * self._old, self.file_samples)
        try:
            with sf.SoundFile(str(self.path)) as file:
                file.seek(read_from)
                waveform = file.read(read_to - read_from, dtype="float32", always_2d=True)
        except Exception as error:  # soundfile raises several types for corrupt files
            raise AudioError(self.path, f"unreadable audio ({error})") from error
        if waveform.shape[0] != read_to - read_from:
            raise AudioError(self.path, f"read {waveform.shape[0]} samples from sample {read_from}, expected "
                                        f"{read_to - read_from} (the header says {self.file_samples})")
        check_float_scale(self.path, waveform, read_from, self.sample_rate)
        mono, _ = to_16k_mono(waveform, self.sample_rate)
        offset = first_block * self._new  # the 16 kHz sample the span read starts at
        return np.ascontiguousarray(mono[start - offset:end - offset], dtype=np.float32)

    def filterbank(self, start: int, end: int) -> np.ndarray:
        """Filterbank frames ``start`` to ``end`` (clipped to the file), ``n x 80`` float32: frame ``i`` is made from
        samples ``[160 i, 160 i + 400)``, as ``filterbank_features`` makes it."""
        start, end = max(0, start), min(end, self.frames)
        if end <= start:
            return np.zeros((0, NUM_MEL_BINS), dtype=np.float32)
        samples = self.samples(start * FRAME_SHIFT_SAMPLES, (end - 1) * FRAME_SHIFT_SAMPLES + MIN_SAMPLES)
        frames = log_mel_filterbank(samples, SAMPLE_RATE).astype(np.float32, copy=False)
        if frames.shape[0] != end - start:  # the header's length and the samples read agree: a guard, not a case
            raise AudioError(self.path, f"frames {start}-{end}: the audio gave {frames.shape[0]} filterbank frames")
        return frames
