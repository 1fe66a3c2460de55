"""Audio file -> the 80-dim log-Mel filterbanks the speech models train on (shared by data preparation and
transcription, so that both compute features the same way).

Any sample rate and channel count in: channels are averaged and other rates resampled to 16 kHz (torchaudio's
windowed-sinc resampler), then torchaudio's Kaldi-compatible ``fbank`` (25 ms window, 10 ms shift, 80 bins) runs
on 16-bit-scaled samples, as fairseq's own speech recipes do. Imports only numpy, soundfile, torch, torchaudio.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import numpy as np
import soundfile as sf
import torch

SAMPLE_RATE = 16000  # features are computed at 16 kHz, mono: other audio is resampled and downmixed
NUM_MEL_BINS = 80
MIN_SAMPLES = 400  # one 25 ms window at 16 kHz
FRAME_SHIFT_SAMPLES = 160  # 10 ms at 16 kHz


class AudioError(ValueError):
    """An audio file that gives no features: ``str(error)`` is ``"PATH: problem"``."""

    def __init__(self, path: Path | str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def feature_frames(num_samples: int, sample_rate: int) -> int:
    """Filterbank frames of ``num_samples`` samples at ``sample_rate`` (0 below one window).

    Exact at 16 kHz; at another rate it takes the resampled length as ``ceil(samples * 16000 / rate)``, which the
    resampler may miss by one sample, so the count may be one frame off.
    """
    resampled = -(-num_samples * SAMPLE_RATE // sample_rate)
    return 0 if resampled < MIN_SAMPLES else 1 + (resampled - MIN_SAMPLES) // FRAME_SHIFT_SAMPLES


def _read(path: Path | str, reader: Callable):
    """``reader(path)`` (a soundfile function), its failures raised as ``AudioError`` naming the file."""
    if not Path(path).is_file():
        raise AudioError(path, "audio file not found")
    try:
        return reader(str(path))
    except Exception as error:  # soundfile raises several types for corrupt or foreign files
        raise AudioError(path, f"unreadable audio ({error})") from error


MAX_FLOAT_PEAK = 2.0  # float samples beyond this (6 dB over full scale) are at another scale, not audio in [-1, 1]


def check_float_scale(path: Path | str, waveform: np.ndarray, first_sample: int = 0, sample_rate: int = SAMPLE_RATE
                      ) -> None:
    """``AudioError`` naming the file if samples read as float reach beyond ``MAX_FLOAT_PEAK``: a float file written
    at 16-bit scale (samples up to 32767) would give features 90 dB too loud. ``first_sample``: where ``waveform``
    starts in the file (at ``sample_rate``), to say when the peak comes."""
    magnitudes = np.abs(waveform)
    if not magnitudes.size or not np.isfinite(magnitudes).all() or magnitudes.max() <= MAX_FLOAT_PEAK:
        return  # NaN and inf are named by the features' check
    peak = int(np.argmax(magnitudes)) // (waveform.shape[1] if waveform.ndim == 2 else 1)
    raise AudioError(path, f"float samples reach {magnitudes.max():g} (at {(first_sample + peak) / sample_rate:.2f} "
                           "s); audio is read in [-1, 1]: samples at 16-bit scale? divide them by 32768")


def _frames_or_error(path: Path | str, num_samples: int, sample_rate: int) -> int:
    frames = feature_frames(num_samples, sample_rate)
    if frames == 0:
        raise AudioError(path, f"empty audio ({num_samples} samples at {sample_rate} Hz)")
    return frames


def audio_frames(path: Path | str) -> int:
    """Filterbank frames of an audio file from its header alone (see ``feature_frames``).

    Raises ``AudioError`` if the file is missing, not audio soundfile reads, or shorter than one 25 ms window.
    """
    info = _read(path, sf.info)
    return _frames_or_error(path, info.frames, info.samplerate)


def to_16k_mono(waveform: np.ndarray, sample_rate: int) -> tuple[np.ndarray, str | None]:
    """``samples x channels`` float32 at any rate -> (mono 16 kHz samples, what was converted or None).

    Several channels are averaged; another rate is resampled (torchaudio's windowed-sinc resampler), so the
    filterbank's mel axis is the same as for LibriSpeech whatever the input. Audio below 16 kHz leaves the mel bins
    above its Nyquist frequency empty, which the conversion says: its features are not those of 16 kHz audio.
    """
    conversions = []
    mono = waveform.mean(axis=1)
    if waveform.shape[1] > 1:
        conversions.append(f"{waveform.shape[1]} channels downmixed")
    if sample_rate != SAMPLE_RATE:
        import torchaudio.functional

        mono = torchaudio.functional.resample(torch.from_numpy(mono), sample_rate, SAMPLE_RATE).numpy()
        conversions.append(f"resampled from {sample_rate} Hz" + (f" (no sound above {sample_rate // 2} Hz)"
                                                                 if sample_rate < SAMPLE_RATE else ""))
    return mono, ", ".join(conversions) or None


def log_mel_filterbank(waveform: np.ndarray, sample_rate: int) -> np.ndarray:
    """``samples`` float waveform in [-1, 1] -> ``T x 80`` float32 log-Mel filterbanks (25 ms / 10 ms)."""
    from torchaudio.compliance import kaldi

    scaled = torch.from_numpy(waveform).float().mul(32768).unsqueeze(0)
    return kaldi.fbank(scaled, num_mel_bins=NUM_MEL_BINS, frame_length=25.0, frame_shift=10.0,
                       sample_frequency=sample_rate).numpy()


def read_16k_mono(path: Path | str) -> tuple[np.ndarray, str | None]:
    """Audio file -> (float32 mono samples at 16 kHz, what was converted to get there or None).

    Raises ``AudioError`` naming the file if it is missing, unreadable, or shorter than one 25 ms window.
    """
    waveform, sample_rate = _read(path, lambda name: sf.read(name, dtype="float32", always_2d=True))
    _frames_or_error(path, waveform.shape[0], sample_rate)
    check_float_scale(path, waveform, 0, sample_rate)
    return to_16k_mono(waveform, sample_rate)


def filterbank_features(path: Path | str) -> tuple[np.ndarray, str | None]:
    """Audio file -> (``T x 80`` float32 log-Mel filterbanks at 16 kHz, what was converted to get there or None).

    Raises ``AudioError`` naming the file if it is missing, unreadable, or shorter than one 25 ms window.
    """
    mono, conversion = read_16k_mono(path)
    return log_mel_filterbank(mono, SAMPLE_RATE).astype(np.float32, copy=False), conversion


class Conversions:
    """Audio files converted to 16 kHz mono, by kind of conversion, for one log line per kind: converted audio
    gives other features than the same sound recorded at 16 kHz mono (an 8 kHz copy transcribes differently), so
    the conversion is said, never silent.

    >>> conversions = Conversions()
    >>> features, conversion = filterbank_features(path)
    >>> conversions.add(path, conversion)  # None (16 kHz mono already) is not counted
    >>> conversions.log(logger)            # "2 files not 16 kHz mono: resampled from 8000 Hz (...) ...: a.wav, b.wav"
    """

    def __init__(self) -> None:
        self.files: dict[str, list[str]] = {}  # conversion -> the files converted so

    def add(self, path: Path | str, conversion: str | None) -> None:
        """Count ``path`` under its ``conversion`` (``to_16k_mono``'s description; None: nothing converted)."""
        if conversion:
            self.files.setdefault(conversion, []).append(str(path))

    def log(self, logger: logging.Logger, shown: int = 3) -> None:
        """One INFO line per kind of conversion: how many files, what was done, the first ``shown`` of them."""
        for conversion, paths in sorted(self.files.items()):
            names = ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more" if len(paths) > shown else "")
            logger.info(f"{len(paths)} file{'s' if len(paths) > 1 else ''} not 16 kHz mono: {conversion} "
                        f"(to 16 kHz mono): {names}")
