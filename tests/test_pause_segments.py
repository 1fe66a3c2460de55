"""Where a recording pauses (``ssm_fairseq.asr.pause_segments``): on recordings made of real utterances and pauses
of faint noise, the segments are the utterances' sounding stretches, found from the audio's filterbank alone."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from ssm_fairseq.asr.features.audio_features import filterbank_features
from ssm_fairseq.asr.pause_segments import frame_levels_db, pauses, quiet_frames, speech_segments

from cli import REPO

TEST_MINI = sorted((REPO / "recipes/librispeech/mini/LibriSpeech/test-mini").rglob("*.flac"))
NOISE = 1 / 32768  # one 16-bit step


def _joined(tmp_path, pause_seconds: float, count: int = 4):
    """``count`` test-mini utterances with ``pause_seconds`` of faint noise between them (and before the first):
    the recording and each utterance's sounding stretch, in filterbank frames."""
    rng = np.random.default_rng(0)
    pieces, spans, at = [], [], 0
    for path in TEST_MINI[:count]:
        pause = rng.normal(0, NOISE, int(pause_seconds * 16000)).astype(np.float32)
        speech = sf.read(path, dtype="float32")[0]
        sounding = np.flatnonzero(np.abs(speech) > 4 * NOISE)  # the utterance files end in digital silence
        pieces += [pause, speech]
        at += len(pause)
        spans.append(((at + sounding[0]) / 160, (at + sounding[-1]) / 160))
        at += len(speech)
    recording = tmp_path / "joined.wav"
    sf.write(recording, np.concatenate(pieces), 16000, subtype="PCM_16")
    return recording, spans


@pytest.mark.parametrize("pause_seconds", [0.3, 1.0])
def test_segments_are_the_utterances_sounding_stretches(tmp_path, pause_seconds):
    recording, spans = _joined(tmp_path, pause_seconds)
    levels = frame_levels_db(filterbank_features(recording)[0])
    segments = speech_segments(levels, 0.25, 3000)
    assert len(segments) == len(spans), (segments, spans)
    for (start, end), (first, last) in zip(segments, spans):
        assert abs(start - first) <= 5 and abs(end - last) <= 5, (segments, spans)  # within 50 ms


def test_levels_are_the_summed_mel_energies_in_db():
    fbank = np.log(np.array([[1.0, 3.0], [10.0, 90.0]]))
    assert frame_levels_db(fbank) == pytest.approx([10 * np.log10(4), 20.0])


def test_a_pause_shorter_than_asked_does_not_cut():
    levels = np.r_[np.full(30, 0.0), np.full(100, 60.0), np.full(20, 0.0), np.full(100, 60.0), np.full(30, 0.0)]
    assert speech_segments(levels, 0.25, 1000) == [(30, 250)]
    assert speech_segments(levels, 0.2, 1000) == [(30, 130), (150, 250)]


def test_a_long_stretch_is_cut_at_its_quietest_frames_into_fitting_pieces():
    rng = np.random.default_rng(1)
    levels = rng.normal(60, 2, 1000)
    levels[420:440] = 30  # a dip too short to be a pause
    segments = speech_segments(levels, 0.5, 600)
    assert segments[0][0] == 0 and segments[-1][1] == 1000
    assert all(end - start <= 600 for start, end in segments)
    assert all(a[1] == b[0] for a, b in zip(segments, segments[1:]))  # no gap, no overlap
    assert 420 <= segments[0][1] < 440  # cut in the dip


def test_levels_without_contrast_have_no_pause():
    levels = np.r_[np.full(100, 50.0), np.full(100, 55.0)]
    assert not quiet_frames(levels).any() and speech_segments(levels, 0.3, 1000) == [(0, 200)]
    assert pauses(np.array([True, True, False, True]), 2) == [(0, 2)]


@pytest.mark.parametrize("min_pause, max_frames", [(0, 100), (-1, 100), (float("nan"), 100), (0.3, 1)])
def test_settings_out_of_range_are_refused(min_pause, max_frames):
    with pytest.raises(ValueError):
        speech_segments(np.zeros(10), min_pause, max_frames)
