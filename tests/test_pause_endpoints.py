"""A stream cut at its audio's pauses (``EndpointRules.pause_seconds``, ``ssm-transcribe --stream
--split-at-pauses``): the segments do not depend on the chunking, and each is decoded as its frames alone would be
(an utterance on a fresh encoder and search), checked against the quiet runs found over the whole recording."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from ssm_fairseq.asr import Recognizer
from ssm_fairseq.asr.endpoints import EndpointRules
from ssm_fairseq.asr.features.filterbank import StreamingFilterbank
from ssm_fairseq.asr.pause_segments import CausalQuietness, pauses, quiet_frames
from ssm_fairseq.asr.segment_formats import read_json
from ssm_fairseq.transcribe import main as transcribe_main

from test_streaming_transcriber import causal  # noqa: F401  (the trained model's fixture)
from test_transcribe import _one_thread  # noqa: F401  (an autouse fixture)

RATE = 16000
NOISE = 1 / 32768  # one 16-bit step
PAUSE = 1.0  # seconds of faint noise between the utterances
MIN_PAUSE = 0.5  # seconds of quiet that end a segment


def _joined(files) -> np.ndarray:
    """The files' audio, each followed by ``PAUSE`` seconds of faint noise."""
    rng = np.random.default_rng(0)
    pieces = []
    for path in files:
        pieces += [sf.read(str(path), dtype="float32")[0], rng.normal(0, NOISE, int(PAUSE * RATE)).astype(np.float32)]
    return np.concatenate(pieces)


def _expected(recognizer: Recognizer, samples: np.ndarray) -> list[tuple[float, float, str]]:
    """The segments a stream cut at pauses should give, found over the whole recording at once: the filterbank
    frames' quiet verdicts (the causal test, all frames in one call), the runs of at least ``MIN_PAUSE`` of them
    dropped, each stretch between them encoded in one call on a fresh encoder and searched as an utterance; the
    stretches without a word left out."""
    fbank = StreamingFilterbank().accept_waveform(samples)
    frames = recognizer.transform_chunk(fbank)
    found = pauses(CausalQuietness().quiet(fbank, samples), round(MIN_PAUSE * 100))
    bounds = [0] + [b for pause in found for b in pause] + [len(frames)]
    segments = []
    for start, end in zip(bounds[::2], bounds[1::2]):
        if end <= start:
            continue
        with torch.no_grad():
            encoded = recognizer.encode_features(frames[start:end], {}, final=True)
        search = recognizer.generator.search(1, recognizer.device)
        search.advance(encoded)
        (best, *_), = search.finish(1, recognizer.generator.length_norm)
        text = recognizer.text(best.tokens)
        if text:
            segments.append((start / 100, end / 100 if end < len(frames) else len(samples) / RATE, text))
    return segments


def _streamed(recognizer: Recognizer, samples: np.ndarray, chunk: int) -> list[tuple[float, float, str]]:
    stream = recognizer.stream(endpoints=EndpointRules(pause_seconds=MIN_PAUSE, blank_rules=False))
    for start in range(0, len(samples), chunk):
        stream.accept_waveform(samples[start:start + chunk])
    return [(round(s.start, 6), round(s.end, 6), s.text) for s in stream.finish_segments()]


def test_causal_quietness_is_the_offline_test_once_the_levels_span_the_range():
    """Speech, a pause, speech, a pause: the causal verdicts are the offline ones once the levels seen hold enough
    of both (the first pause's frames are quiet once a tenth of the levels seen are low); before, none is quiet."""
    levels = np.concatenate([np.full(50, 60.0), np.full(50, 20.0), np.full(50, 60.0), np.full(50, 20.0)])
    fbank = np.log(np.exp(levels / (10 / np.log(10)))[:, None] / 80 * np.ones((1, 80)))
    causal = CausalQuietness().quiet(fbank)
    assert not causal[:50].any()  # speech only so far: nothing to compare with
    assert causal[60:100].all() and not causal[50:55].any()  # 10% of the levels low: a floor to compare with
    np.testing.assert_array_equal(causal[100:], quiet_frames(levels)[100:])
    chunked = CausalQuietness()
    assert np.array_equal(np.concatenate([chunked.quiet(fbank[i:i + 7]) for i in range(0, 200, 7)]), causal)


def test_pause_segments_are_the_same_at_every_chunk_size_and_each_decodes_as_alone(causal):  # noqa: F811
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", beam=2)
    samples = _joined(files[:3])
    expected = _expected(recognizer, samples)
    assert len(expected) >= 3  # the three utterances at least (a pause inside one may cut it too)
    for chunk_ms in (80, 320, 1000):
        streamed = _streamed(recognizer, samples, chunk_ms * 16)
        assert [text for *_, text in streamed] == [text for *_, text in expected], chunk_ms
        np.testing.assert_allclose([s[:2] for s in streamed], [s[:2] for s in expected], atol=1e-6)


def test_the_command_line_streams_with_split_at_pauses(causal, tmp_path, capsys):  # noqa: F811
    data, checkpoint, files = causal
    samples = _joined(files[:3])
    path = tmp_path / "joined.wav"
    sf.write(path, samples, RATE, subtype="FLOAT")
    recognizer = Recognizer(checkpoint, device="cpu")
    expected = _streamed(recognizer, samples, 320 * 16)
    capsys.readouterr()
    assert transcribe_main(["--checkpoint", str(checkpoint), "--cpu", "--stream", "--split-at-pauses",
                            str(MIN_PAUSE), "--format", "json", str(path)]) == 0
    (_, segments), = read_json(capsys.readouterr().out)
    assert [segment.text for segment in segments] == [text for *_, text in expected]


@pytest.mark.parametrize("rules", [dict(pause_seconds=0), dict(pause_seconds=float("nan")),
                                   dict(pause_seconds=True), dict(blank_rules=False)])
def test_pause_settings_out_of_range_are_refused(rules):
    with pytest.raises(ValueError, match="pause_seconds"):
        EndpointRules(**rules)


def test_a_pre_roll_starts_the_segments_after_pauses_earlier_at_every_chunk_size(causal, monkeypatch):  # noqa: F811
    """``stream.PAUSE_PRE_ROLL`` frames of each pause's end are fed before the next segment: the segments after a
    pause start that much earlier, the same at every chunk size."""
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", beam=2)
    samples = _joined(files[:3])
    plain = _streamed(recognizer, samples, 320 * 16)
    monkeypatch.setattr("ssm_fairseq.asr.stream.PAUSE_PRE_ROLL", 10)
    rolled = [_streamed(recognizer, samples, chunk_ms * 16) for chunk_ms in (80, 320, 1000)]
    assert rolled[0] == rolled[1] == rolled[2]
    assert len(rolled[0]) == len(plain) and rolled[0][0][:2] == plain[0][:2]
    np.testing.assert_allclose([s[0] + 0.1 for s in rolled[0][1:]], [s[0] for s in plain[1:]], atol=1e-6)
    np.testing.assert_allclose([s[1] for s in rolled[0]], [s[1] for s in plain], atol=1e-6)
