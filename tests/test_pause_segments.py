"""Where a recording pauses (``ssm_fairseq.asr.pause_segments``): on recordings made of real utterances and pauses
of faint noise, the segments are the utterances' sounding stretches, found from the audio's filterbank alone."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from ssm_fairseq.asr.features.audio_features import filterbank_features
from ssm_fairseq.asr.features.audio_features import log_mel_filterbank
from ssm_fairseq.asr.features.filterbank import StreamingFilterbank
from ssm_fairseq.asr.pause_segments import (DIGITAL_MARGIN_FRAMES, CausalQuietness, frame_levels_db, pauses,
                                            starts_in_pause, quiet_frames, silent_runs, speech_segments)

from cli import REPO

TEST_MINI = sorted((REPO / "recipes/librispeech/mini/LibriSpeech/test-mini").rglob("*.flac"))
NOISE = 1 / 32768  # one 16-bit step


def _joined(tmp_path, pause_seconds: float, count: int = 4):
    """``count`` test-mini utterances with ``pause_seconds`` of faint noise between them (and before the first):
    the recording and each utterance's samples ``(start, end, first sound, end of the last sound)`` in it."""
    rng = np.random.default_rng(0)
    pieces, spans, at = [], [], 0
    for path in TEST_MINI[:count]:
        pause = rng.normal(0, NOISE, int(pause_seconds * 16000)).astype(np.float32)
        speech = sf.read(path, dtype="float32")[0]
        sounding = np.flatnonzero(speech)  # the utterance files begin and end in digital silence
        pieces += [pause, speech]
        at += len(pause)
        spans.append((at, at + len(speech), at + sounding[0], at + sounding[-1] + 1))
        at += len(speech)
    recording = tmp_path / "joined.wav"
    sf.write(recording, np.concatenate(pieces), 16000, subtype="PCM_16")
    return recording, spans


@pytest.mark.parametrize("pause_seconds", [0.3, 1.0])
def test_segments_are_the_utterances_files(tmp_path, pause_seconds):
    """Each piece holds its utterance's sound and the digital silence the file begins and ends with (its whole frames
    of zeros, whatever their length), and of the pause's noise at most what its edge frames' windows reach."""
    recording, spans = _joined(tmp_path, pause_seconds)
    levels = frame_levels_db(filterbank_features(recording)[0])
    segments = speech_segments(levels, 0.25, 3000)
    assert len(segments) == len(spans), (segments, spans)
    for (start, end), (first, last, sound, sound_end) in zip(segments, spans):
        window_end = (end - 1) * 160 + 400  # the piece's last sample
        # its first frame's window reaches into the file, its last frame's starts in it; all its sound inside
        assert start * 160 + 400 > first and start * 160 <= sound, (segments, spans)
        assert (end - 1) * 160 < last and window_end >= sound_end, (segments, spans)
        if sound - first >= 400:  # whole frames of the file's leading zeros: the piece starts at the first of them
            assert start == -(-first // 160), (start, first)
        if last - sound_end >= 400:
            assert window_end > last - 160, (end, last)


def test_a_clip_with_margins_of_digital_silence_between_pauses_of_noise_is_cut_at_its_edges():
    """Noise, a clip (zeros, sound, zeros), noise: the clip's whole frames of zeros are kept with it, the frames
    holding noise are not; a frame of zeros in the middle of the noise is quiet after the margin's length."""
    rng = np.random.default_rng(2)
    noise = lambda n: (np.round(rng.normal(0, 1, n)) / 32768).astype(np.float32)  # noqa: E731 (16-bit noise)
    sound = (0.3 * np.sin(np.arange(16000) * 0.05) * rng.uniform(0.5, 1, 16000)).astype(np.float32)
    first = 8000 + 37  # not on the frame grid
    samples = np.concatenate([noise(first), np.zeros(800, np.float32), sound, np.zeros(900, np.float32),
                              noise(8000)])
    last = first + 800 + 16000 + 900
    levels = frame_levels_db(log_mel_filterbank(samples, 16000))
    (start, end), = speech_segments(levels, 0.25, 3000)
    assert start == -(-first // 160) and end == (last - 400) // 160 + 1  # the frames wholly inside the clip
    plain = levels.copy()
    plain[start:end][levels[start:end] < -45] = levels[:start].min()  # the zeros as faint as the noise: cut there
    (start_noise, end_noise), = speech_segments(plain, 0.25, 3000)
    assert start_noise > start and end_noise < end


def test_a_pause_of_digital_silence_still_cuts_after_the_margin():
    levels = np.r_[np.full(100, 60.0), np.full(50, -50.2), np.full(100, 60.0)]
    assert speech_segments(levels, 0.25, 1000) == [(0, 100 + DIGITAL_MARGIN_FRAMES), (150, 250)]
    assert silent_runs(levels)[[99, 100, 104, 149, 150]].tolist() == [0, 1, 5, 50, 0]


def test_the_stream_verdicts_on_digital_silence_do_not_depend_on_the_chunking():
    """Runs of digital silence that span the chunks' edges: the margin counts on from the last chunk."""
    levels = np.r_[np.full(60, 60.0), np.full(30, 20.0), np.full(8, -50.2), np.full(40, 60.0), np.full(3, -50.2),
                   np.full(40, 20.0), np.full(40, -50.2), np.full(30, 60.0)]
    fbank = np.log(np.exp(levels / (10 / np.log(10)))[:, None] / 80 * np.ones((1, 80)))
    whole = CausalQuietness().quiet(fbank)
    for size in (1, 3, 7):
        chunked = CausalQuietness()
        assert np.array_equal(np.concatenate([chunked.quiet(fbank[i:i + size]) for i in range(0, len(fbank), size)]),
                              whole), size
    assert whole[70:90].all() and not whole[90:90 + DIGITAL_MARGIN_FRAMES].any() and whole[95:98].all()
    assert not whole[138:141].any() and whole[141:181].all()  # a short run of zeros: all margin
    assert not whole[181:181 + DIGITAL_MARGIN_FRAMES].any() and whole[186:221].all()


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


def _clip_after_noise(lead: int) -> tuple[np.ndarray, int, int]:
    """0.5 s of sound, 0.5 s of 16-bit noise (its last sample not zero), a clip of ``lead`` zeros and 0.5 s of
    sound, 0.5 s of noise: the samples, the clip's first sample and its sound's."""
    rng = np.random.default_rng(3)
    noise = lambda n: (np.round(rng.normal(0, 1, n)) / 32768).astype(np.float32)  # noqa: E731
    sound = (0.3 * np.sin(np.arange(8000) * 0.05 + 0.4) + 0.05).astype(np.float32)
    before = np.concatenate([sound, noise(8000 + 53)])
    before[-1] = 2 / 32768
    return np.concatenate([before, np.zeros(lead, np.float32), sound, noise(8000)]), len(before), len(before) + lead


def test_a_window_starts_in_a_pause_when_its_first_shift_is_faint_and_not_digital_silence():
    sound = np.linspace(0.1, 0.2, 240, dtype=np.float32)
    faint = np.full(160, 1e-4, dtype=np.float32)
    assert starts_in_pause(np.r_[faint, sound])  # the first shift the pause's noise, then the sound
    assert starts_in_pause(np.r_[faint[:10], np.zeros(150), sound])  # noise, a clip's zeros, its sound
    assert not starts_in_pause(np.r_[np.zeros(160), sound])  # a clip's digital silence: its own
    assert not starts_in_pause(np.r_[faint[:150], sound[:10], sound])  # sound in the first shift
    assert not starts_in_pause(np.r_[0.05 * sound[:160], sound])  # 26 dB below: a soft onset, the sound's


@pytest.mark.parametrize("lead", [0, 192, 800])
def test_a_piece_starts_where_its_clip_starts_when_the_samples_are_looked_at(lead):
    """After a pause of noise, a clip with ``lead`` zeros: the level test starts the piece at a frame whose window
    holds the pause's noise (but for a lead of whole frames of zeros, kept as the clip's margin); with the frames'
    samples, at the first frame whose window starts in the clip (or whose first shift holds its sound)."""
    samples, clip, sound = _clip_after_noise(lead)
    levels = frame_levels_db(log_mel_filterbank(samples, 16000))
    window = lambda i: samples[160 * i:160 * i + 400]  # noqa: E731
    _, (plain, _) = speech_segments(levels, 0.25, 3000)
    _, (start, _) = speech_segments(levels, 0.25, 3000, window)
    # the first frame wholly in the clip; without zeros, the first whose first shift holds the sound
    assert start == (-(-clip // 160) if lead else sound // 160)
    if lead < 400:
        assert plain * 160 < clip and plain * 160 + 400 > sound  # its first window: the pause's noise and the sound
    else:
        assert plain == start


@pytest.mark.parametrize("lead", [0, 192, 800])
def test_the_stream_finds_the_clips_start_at_every_chunk_size(lead):
    """``CausalQuietness`` given the samples: the same verdicts at every chunking, the first frame after the pause
    that is not quiet the offline piece's first."""
    samples, clip, _ = _clip_after_noise(lead)
    levels = frame_levels_db(log_mel_filterbank(samples, 16000))
    _, (start, _) = speech_segments(levels, 0.25, 3000, lambda i: samples[160 * i:160 * i + 400])
    verdicts = []
    for chunk in (1280, 5120, 16000, len(samples)):
        filterbank, quietness = StreamingFilterbank(), CausalQuietness()
        verdicts.append(np.concatenate([quietness.quiet(filterbank.accept_waveform(samples[i:i + chunk]),
                                                        samples[i:i + chunk])
                                        for i in range(0, len(samples), chunk)]))
        assert np.array_equal(verdicts[-1], verdicts[0]), chunk
    quiet = verdicts[0]
    assert quiet[start - 30:start].all() and not quiet[start]
    unlooked = CausalQuietness().quiet(StreamingFilterbank().accept_waveform(samples))
    assert lead > 400 or not unlooked[start - 1]  # without the samples, the frame before ended the pause
