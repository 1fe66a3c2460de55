"""What long-file transcription reads and where it cuts, without a model: ``AudioSpans`` (a span of a file as the
whole file's samples and filterbanks would have it, at any rate and channel count) and the windows
(``plan_windows``, ``Windowing``)."""
from __future__ import annotations

import re

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.functional

from ssm_fairseq.asr.features.audio_features import AudioError, filterbank_features, read_16k_mono
from ssm_fairseq.asr.features.audio_spans import AudioSpans
from ssm_fairseq.asr.windowing import Window, Windowing, plan_windows

from cli import REPO

UTTERANCE = REPO / "recipes/librispeech/mini/LibriSpeech/test-mini"


def _speech(seconds: float) -> np.ndarray:
    """Mini-corpus speech repeated to ``seconds`` at 16 kHz."""
    samples, rate = sf.read(sorted(UTTERANCE.glob("*/*/*.flac"))[0], dtype="float32")
    assert rate == 16000
    return np.resize(samples, int(seconds * 16000))


# (rate, channels, largest difference allowed from the whole file's filterbanks): resampling a span gives the
# whole file's samples to float32 rounding; below 16 kHz the empty top mel bins hold logs of near-zero energies,
# which that rounding moves more
FORMATS = [(16000, 1, 0.0), (16000, 2, 0.0), (44100, 2, 1e-3), (48000, 1, 1e-3), (8000, 1, 0.1)]


@pytest.mark.parametrize("rate, channels, tolerance", FORMATS)
def test_a_span_is_the_whole_files_slice(tmp_path, rate, channels, tolerance):
    speech = _speech(7.3)
    audio = speech if rate == 16000 else torchaudio.functional.resample(torch.from_numpy(speech), 16000, rate).numpy()
    if channels == 2:
        audio = np.stack([audio, 0.5 * audio[::-1]], axis=1)
    path = tmp_path / "audio.wav"
    sf.write(path, audio, rate, subtype="FLOAT")
    samples, conversion = read_16k_mono(path)
    fbank, _ = filterbank_features(path)
    spans = AudioSpans(path)
    assert (spans.frames, spans.samples_16k, spans.conversion) == (len(fbank), len(samples), conversion)
    assert spans.duration == pytest.approx(len(audio) / rate)
    for start, end in [(0, 1), (0, 16000), (12345, 40001), (len(samples) - 4999, len(samples)), (0, len(samples))]:
        span = spans.samples(start, end)
        assert span.dtype == np.float32 and len(span) == end - start
        if rate == 16000:
            assert np.array_equal(span, samples[start:end])
        else:
            assert np.abs(span - samples[start:end]).max() < 1e-6
    assert len(spans.samples(len(samples) - 10, len(samples) + 500)) == 10  # clipped to the file
    for start, end in [(0, 1), (0, 300), (57, 420), (len(fbank) - 91, len(fbank))]:
        frames = spans.filterbank(start, end)
        assert frames.shape == (end - start, 80)
        assert np.abs(frames - fbank[start:end]).max() <= tolerance + 1e-4


def test_a_missing_or_empty_file_is_named(tmp_path):
    with pytest.raises(AudioError, match="audio file not found"):
        AudioSpans(tmp_path / "missing.flac")
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(100, dtype=np.float32), 16000)
    with pytest.raises(AudioError, match=f"{empty}: empty audio"):
        AudioSpans(empty)


@pytest.mark.parametrize("frames", [1, 399, 400, 401, 403, 1000, 1001, 1603, 5000])
@pytest.mark.parametrize("window, context, stride", [(400, 0, 4), (400, 48, 4), (400, 196, 4), (240, 60, 3)])
def test_window_centres_tile_the_file(frames, window, context, stride):
    windows = plan_windows(frames, window, context, stride)
    if frames <= window:
        assert windows == [Window(0, 0, frames, frames)]
        return
    assert windows[0].centre_start == 0 and windows[-1].centre_end == frames == windows[-1].end
    assert all(a.centre_end == b.centre_start for a, b in zip(windows, windows[1:]))
    for i, w in enumerate(windows):
        assert 0 <= w.start <= w.centre_start < w.centre_end <= w.end <= frames
        assert w.end - w.start <= window
        assert w.start % stride == w.centre_start % stride == 0
        assert w.centre_start - w.start >= (context if i else 0)  # the context each side, but at the file's ends
        assert w.end - w.centre_end >= (context if w.end < frames else 0)
        assert w.end == frames or (w.end - w.start == window and w.centre_end % stride == 0)
    assert windows[-1].end - windows[-1].start > window - stride  # the last window is whole, not a remnant


@pytest.mark.parametrize("arguments, message", [
    ({"window_seconds": 10, "window_context_seconds": 5}, r"must be more than twice window_context_seconds"),
    ({"window_context_seconds": -1}, "window_context_seconds must be at least 0"),
    ({"window_seconds": float("nan")}, "window_seconds must be a finite number"),
    ({"window_cmvn": "global"}, r"window_cmvn must be one of \('window', 'file'\)"),
])
def test_windowing_out_of_range_is_named(arguments, message):
    with pytest.raises(ValueError, match=message):
        Windowing(**arguments)


def test_window_frames_are_whole_encoder_frames_within_the_model():
    assert Windowing(window_seconds=30, window_context_seconds=4).frames(4, 6000) == (3000, 400)
    assert Windowing(window_seconds=10.01, window_context_seconds=0.013).frames(4, 6000) == (1000, 0)
    with pytest.raises(ValueError, match=r"window_seconds 70 is longer than this model takes: 60.00 s \(6000 "):
        Windowing(window_seconds=70, window_context_seconds=4).frames(4, 6000)
    with pytest.raises(ValueError, match="leave no encoder frame between the contexts"):
        Windowing(window_seconds=0.1, window_context_seconds=0.049).frames(4, 6000)


def test_a_float_file_at_16_bit_scale_is_named_with_its_peak(tmp_path):
    """Float samples up to 32767 would give features 90 dB too loud: refused, whole file or span, naming the file
    and when the peak comes; a float file slightly over full scale is audio and is read."""
    loud = tmp_path / "int16_scale.wav"
    samples = _speech(2.0)
    sf.write(loud, samples * 32767 / np.abs(samples).max(), 16000, subtype="FLOAT")
    peak_seconds = int(np.abs(samples).argmax()) / 16000
    message = re.escape(f"{loud}: float samples reach 32767 (at {peak_seconds:.2f} s); audio is read in [-1, 1]: "
                        "samples at 16-bit scale? divide them by 32768")
    with pytest.raises(AudioError, match=message):
        read_16k_mono(loud)
    with pytest.raises(AudioError, match=message):
        AudioSpans(loud).samples(0, 32000)
    over = tmp_path / "over.wav"
    sf.write(over, samples * 1.5 / np.abs(samples).max(), 16000, subtype="FLOAT")
    assert np.abs(read_16k_mono(over)[0]).max() == pytest.approx(1.5)
