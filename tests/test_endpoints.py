"""Endpoints and segments of streams and files (``Recognizer.stream(endpoints=...)``, ``ssm-transcribe --endpoints
--format ...``): segments end at known silences, the search restarts at each endpoint, and the written formats
parse back.

The tiny causal model ``test_streaming_transcriber`` trains cannot tell speech from silence, so the silences are
checked with its encoder's and joiner's outputs replaced by an oracle that emits a word at every encoder frame
holding sound (``_SoundEncoder``, ``toy_transducer.MarkerJoiner``): the filterbank, the transforms, the frames' wait
for whole sub-sampling groups, the search, the endpoint rules, the segments' times and the words' times run for real.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from ssm_fairseq.asr import Recognizer
from ssm_fairseq.asr.endpoints import EndpointRules
from ssm_fairseq.asr.search.word_timestamps import LEAD_FRAMES, TAIL_FRAMES
from ssm_fairseq.asr.segment_formats import read_json, read_subtitles
from ssm_fairseq.asr.transcripts import joined
from ssm_fairseq.transcribe import main as transcribe_main

from test_streaming_transcriber import SEARCHES, causal  # noqa: F401  (causal: the trained model's fixture)
from test_transcribe import _one_thread  # noqa: F401  (an autouse fixture)
from toy_transducer import MarkerJoiner

pytestmark = pytest.mark.slow

RATE = 16000


class _SoundEncoder(torch.nn.Module):
    """The causal encoder's ``step`` replaced by an oracle: ``1 x m x 1``, 1.0 at each encoder frame (a group of
    ``stride`` feature frames; the stream's last group may be partial) where some feature frame is louder than
    digital silence (``silence``: its transformed features), else 0.0."""

    def __init__(self, encoder: torch.nn.Module, silence: torch.Tensor, stride: int):
        super().__init__()
        self.encoder, self.silence, self.stride = encoder, silence, stride

    def check_streamable(self) -> None:
        self.encoder.check_streamable()

    def step(self, features: torch.Tensor, cache: dict, final: bool = False) -> torch.Tensor:
        n = features.shape[1]
        assert final or n % self.stride == 0  # a stream gives the encoder whole sub-sampling groups
        sound = (features[0] > self.silence + 1.0).any(-1)
        groups = torch.nn.functional.pad(sound, (0, -n % self.stride)).reshape(-1, self.stride).any(-1)
        return groups.to(features.dtype).reshape(1, -1, 1)




def _oracle(checkpoint: Path) -> Recognizer:
    recognizer = Recognizer(checkpoint, device="cpu", beam=1, max_symbols_per_frame=1)
    silence_frames = recognizer.transform_chunk(
        recognizer.stream().filterbank.accept_waveform(np.zeros(RATE // 10, np.float32)))
    silence = torch.from_numpy(silence_frames).max(0).values
    unit = next(i for i, piece in enumerate(recognizer.dictionary.symbols) if piece.startswith("\u2581")
                and len(piece) > 1)
    model = recognizer.model
    model.encoder = _SoundEncoder(model.encoder, silence, recognizer.encoder_stride)
    model.joiner = MarkerJoiner(len(recognizer.dictionary), model.blank, unit)
    return recognizer


def _speech_and_silences(files: list[Path], silences: list[float]) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """The files' audio joined with ``silences[i]`` seconds of digital silence after file ``i`` -> the samples and
    each file's (first, last) non-zero sample's time."""
    pieces, spans, at = [], [], 0
    for path, silence in zip(files, silences):
        audio, rate = sf.read(str(path), dtype="float32")
        assert rate == RATE
        sound = np.flatnonzero(audio)
        spans.append(((at + sound[0]) / RATE, (at + sound[-1] + 1) / RATE))
        pieces += [audio, np.zeros(int(silence * RATE), np.float32)]
        at += len(audio) + int(silence * RATE)
    return np.concatenate(pieces), spans


def test_segments_end_at_known_silences_and_each_holds_its_speech(causal):
    """Three utterances with 2.0 s, then 4.5 s of digital silence after them, streamed in 320 ms chunks with the
    default rules (0.8 s after speech, 2.4 s without speech, 20 s at most): three segments, each holding the words
    of its utterance's sound, timed within it; each endpoint 0.8 s after the last sound frame's word, at most one
    chunk (and one encoder frame) later, inside the silence; the 4.5 s silence has a segment without a word (rule
    1), not kept; the segments start at 0 and the last ends with the audio."""
    data, checkpoint, files = causal
    recognizer = _oracle(checkpoint)
    samples, spans = _speech_and_silences(files[:3], [2.0, 4.5, 0.3])
    rules = EndpointRules()
    stream = recognizer.stream(timestamps=True, endpoints=rules)
    ends = []
    for start in range(0, len(samples), 5120):
        stream.accept_waveform(samples[start:start + 5120])
        ends += [segment.end for segment in stream.segments[len(ends):]]
    segments = stream.finish_segments()
    assert len(segments) == 3
    assert [s.end for s in segments[:2]] == ends[:2]  # known as soon as the chunk that ended them was accepted
    assert segments[0].start == 0 and segments[-1].end == pytest.approx(len(samples) / RATE)
    frame = recognizer.frame_seconds
    lead, tail = LEAD_FRAMES * frame, TAIL_FRAMES * frame  # the blank frames a word's times reach over
    for n, (segment, (first, last)) in enumerate(zip(segments, spans)):
        assert segment.words and segment.text == " ".join(w.word for w in segment.words)
        # a word's emission frame starts up to 55 ms before its sound (a filterbank window reaches 25 ms back, the
        # encoder frame 30 ms more) and ends within one frame after it; its times reach over blank frames around it
        assert first - 0.055 - lead - 1e-9 <= segment.words[0].start
        assert segment.words[-1].end <= last + frame + tail + 1e-9
        assert segment.start <= segment.words[0].start and segment.words[-1].end <= segment.end
        if n < 2:  # ended by rule 2 inside the following silence
            after = segment.words[-1].end - tail + rules.silence_after_speech  # blanks after the last emission
            assert after - 1e-9 <= segment.end <= after + 0.32 + frame
            assert segment.end < spans[n + 1][0]
    # the 4.5 s silence after the second utterance: rule 2 ended its segment, then rule 1 a segment without words
    assert segments[2].start >= segments[1].end + rules.silence_without_speech
    # without endpoints: one segment, the whole stream, with every word
    whole = recognizer.stream(timestamps=True)
    whole.accept_waveform(samples)
    (one,) = whole.finish_segments()
    assert (one.start, one.end) == (0, pytest.approx(len(samples) / RATE))
    assert [w.word for w in one.words] == [w.word for s in segments for w in s.words]
    assert [w.start for w in one.words] == pytest.approx([w.start for s in segments for w in s.words])


def test_at_each_endpoint_the_search_restarts_and_the_encoder_carries_on(causal):
    """The tiny model with a blank penalty emits units at every frame, so only the longest-segment rule ends its
    segments (here 0.5 s): each segment's text is that of a fresh search over the segment's own frames of the
    whole stream's encoder output (the encoder ran on, its state never reset), not of the search continuing."""
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", **SEARCHES["beam"])
    samples = sf.read(str(files[0]), dtype="float32")[0]
    stream = recognizer.stream(endpoints=EndpointRules(max_segment=0.5))
    for start in range(0, len(samples), 2560):
        stream.accept_waveform(samples[start:start + 2560])
    segments = stream.finish_segments()
    assert len(segments) >= 3 and all(s.text for s in segments)
    assert all(a.end == b.start for a, b in zip(segments, segments[1:]))
    assert [s.text for s in segments] == _fresh_searches(recognizer, files[0], segments)


def _fresh_searches(recognizer: Recognizer, path: Path, segments: list) -> list[str]:
    """The text of a fresh search (``generator.search``, with its LM if any) over each segment's frames of the whole
    file's encoder output."""
    frames = recognizer.features(path).unsqueeze(0)
    with torch.no_grad():
        encoded = recognizer.model.encoder(frames, torch.tensor([frames.shape[1]]))["encoder_out"]
    bounds = [round(s.start / recognizer.frame_seconds) for s in segments] + [encoded.shape[1]]
    texts = []
    for first, last in zip(bounds, bounds[1:]):
        search = recognizer.generator.search(1, recognizer.device)
        search.advance(encoded[:, first:last])
        (best, *_), = search.finish(1, recognizer.generator.length_norm)
        texts.append(recognizer.text(best.tokens))
    return texts


def _stream_in_chunks(stream, samples: np.ndarray, chunk: int = 2560, each=None) -> list:
    """``samples`` through ``stream`` in ``chunk``-sample chunks (``each(stream, partial)`` after each) -> its
    segments."""
    for start in range(0, len(samples), chunk):
        partial = stream.accept_waveform(samples[start:start + chunk])
        if each is not None:
            each(stream, partial)
    return stream.finish_segments()


def test_with_lm_fusion_the_lm_context_restarts_at_each_endpoint(causal):
    """A known LM whose scores depend on the whole context (``CountingBigramDecoder``: the sum of the units so far)
    fused into a stream cut every 0.5 s: each segment's text is that of a fresh fused search over its frames, whose
    LM starts from ``</s>`` alone; and the LM changes the texts (the same segments without it differ)."""
    from test_lm_fusion import bigram_lm
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", **SEARCHES["beam"])
    samples = sf.read(str(files[0]), dtype="float32")[0]
    plain = _fresh_searches(recognizer, files[0], _stream_in_chunks(
        recognizer.stream(endpoints=EndpointRules(max_segment=0.5)), samples))
    recognizer.generator.lm_model = bigram_lm(len(recognizer.dictionary), seed=1, sharpness=6.0).float()
    recognizer.generator.lm_weight = 2.0
    segments = _stream_in_chunks(recognizer.stream(endpoints=EndpointRules(max_segment=0.5)), samples)
    assert len(segments) >= 3 and all(s.text for s in segments)
    assert [s.text for s in segments] == _fresh_searches(recognizer, files[0], segments)
    assert [s.text for s in segments] != plain[:len(segments)]


def test_a_long_stream_keeps_only_its_segment_in_progress(causal):
    """Four files joined into one stream cut every 0.5 s: after every chunk, the partial transcript is the whole
    detokenization of the best hypothesis, whose units and frames are the segment's alone (at most 0.5 s and a
    chunk of frames); the encoder's cache keeps its size, the filterbank and the frames waiting for the encoder
    hold less than a chunk; the finished segments are kept one by one, their texts joined only at the end."""
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", **SEARCHES["beam"])
    samples = np.concatenate([sf.read(str(path), dtype="float32")[0] for path in files])
    chunk, frame = 2560, recognizer.frame_seconds
    seen = {"cache": set(), "units": 0, "chunks": 0}

    def check(stream, partial: str) -> None:
        best = stream.partial_hypothesis()
        assert partial == recognizer.text(best.tokens)
        assert stream.search.frames_done[0] * frame <= 0.5 + chunk / RATE + 1e-9
        assert len(best.tokens) <= 2 * stream.search.frames_done[0]  # max_symbols_per_frame 2
        assert stream.filterbank.pending_samples < 400 and len(stream.waiting) < recognizer.encoder_stride
        seen["cache"].add(sum(t.numel() for t in _tensors(stream.encoder_cache)))
        seen["units"] = max(seen["units"], len(stream.text.units))
        seen["chunks"] += 1

    stream = recognizer.stream(endpoints=EndpointRules(max_segment=0.5))
    segments = _stream_in_chunks(stream, samples, chunk, check)
    assert len(seen["cache"]) == 1 and seen["chunks"] == -(-len(samples) // chunk)
    assert len(segments) >= 8 and joined(segments).text == " ".join(s.text for s in segments)
    assert seen["units"] <= 2 * round((0.5 + chunk / RATE) / frame)


def _tensors(value):
    """Every tensor in a nested cache (dicts, lists, tuples)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def segments_with_resets(recognizer: Recognizer, path: Path) -> list:
    """``path`` streamed in 160 ms chunks, cut every 0.5 s (rule 3) with the encoder reset at each endpoint: its
    segments, at least three, each with words."""
    samples = sf.read(str(path), dtype="float32")[0]
    stream = recognizer.stream(endpoints=EndpointRules(max_segment=0.5, reset_encoder=True))
    for start in range(0, len(samples), 2560):
        stream.accept_waveform(samples[start:start + 2560])
    segments = stream.finish_segments()
    assert len(segments) >= 3 and all(s.text for s in segments)
    return segments


def test_with_reset_encoder_each_segment_is_its_audio_transcribed_alone(causal):
    """``reset_encoder``: at each endpoint the encoder starts afresh too, so each segment's text is that of a fresh
    encoder and a fresh search over the segment's own filterbank frames (those its encoder frames stand for)."""
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", **SEARCHES["beam"])
    segments = segments_with_resets(recognizer, files[0])
    features = recognizer.features(files[0]).unsqueeze(0)
    stride, frame = recognizer.encoder_stride, recognizer.frame_seconds
    bounds = [round(s.start / frame) * stride for s in segments] + [features.shape[1]]
    texts = []
    for first, last in zip(bounds, bounds[1:]):
        with torch.no_grad():
            encoded = recognizer.model.encoder(features[:, first:last], torch.tensor([last - first]))["encoder_out"]
        search = recognizer.generator.search(1, recognizer.device)
        search.advance(encoded)
        (best, *_), = search.finish(1, recognizer.generator.length_norm)
        texts.append(recognizer.text(best.tokens))
    assert [s.text for s in segments] == texts
    carried = recognizer.stream(endpoints=EndpointRules(max_segment=0.5))
    samples = sf.read(str(files[0]), dtype="float32")[0]
    for start in range(0, len(samples), 2560):
        carried.accept_waveform(samples[start:start + 2560])
    assert [s.start for s in carried.finish_segments()] == [s.start for s in segments]


def _cli(checkpoint: Path, *arguments: str) -> list[str]:
    return [*arguments, "--checkpoint", str(checkpoint), "--beam", "1", "--max-symbols-per-frame", "2",
            "--blank-penalty", "20", "--cpu"]


def test_cli_writes_segments_in_every_format_and_they_parse_back(causal, tmp_path, capsys):
    data, checkpoint, files = causal
    paths = [str(path) for path in files[:2]]
    streamed = ["--stream", "--chunk-ms", "160", "--endpoints", "--max-segment", "0.6"]
    assert transcribe_main(_cli(checkpoint, *paths, *streamed, "--format", "json", "--timestamps")) == 0
    document = capsys.readouterr().out
    files_segments = read_json(document)
    assert [path for path, _ in files_segments] == paths
    for path, segments in files_segments:
        duration = sf.info(path).duration
        assert len(segments) >= 2 and segments[0].start == 0 and segments[-1].end == pytest.approx(duration, abs=1e-3)
        assert all(a.end == b.start for a, b in zip(segments, segments[1:]))
        for segment in segments:
            assert segment.text.split() == [w[0] for w in segment.words]
            assert all(segment.start - 1e-3 <= w[1] <= w[2] <= segment.end + 1e-3 for w in segment.words)
    assert json.loads(document)[0]["segments"][0]["words"]

    assert transcribe_main(_cli(checkpoint, *paths, *streamed, "--format", "text")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{path}\t{' '.join(s.text for s in segments)}" for path, segments in files_segments]

    assert transcribe_main(_cli(checkpoint, *paths, *streamed, "--format", "tsv")) == 0
    rows = [row.split("\t") for row in capsys.readouterr().out.splitlines()]
    assert rows[0] == ["path", "start", "end", "text"]
    assert [row[3] for row in rows[1:]] == [s.text for _, segments in files_segments for s in segments]

    out = tmp_path / "subtitles"
    for subtitle_format in ("srt", "vtt"):
        assert transcribe_main(_cli(checkpoint, *paths, *streamed, "--format", subtitle_format,
                                    "--output-dir", str(out))) == 0
        for path, segments in files_segments:
            written = (out / f"{Path(path).stem}.{subtitle_format}").read_text()
            cues = read_subtitles(written, subtitle_format)
            assert [c.text for c in cues] == [s.text for s in segments]
            assert [(c.start, c.end) for c in cues] == [(round(s.start, 3), round(s.end, 3)) for s in segments]
    capsys.readouterr()
    with pytest.raises(SystemExit):  # subtitles of two files on stdout: a usage error
        transcribe_main(_cli(checkpoint, *paths, "--format", "srt"))
    with pytest.raises(SystemExit):  # a rule without --endpoints
        transcribe_main(_cli(checkpoint, *paths, "--max-segment", "3"))


def test_offline_files_are_one_segment_unless_endpoints_cut_their_words(causal, capsys):
    data, checkpoint, files = causal
    path = str(files[0])
    assert transcribe_main(_cli(checkpoint, path, "--format", "json", "--timestamps")) == 0
    ((_, whole),) = read_json(capsys.readouterr().out)
    assert len(whole) == 1 and whole[0].start == 0 and whole[0].end == pytest.approx(sf.info(path).duration, 1e-3)
    assert transcribe_main(_cli(checkpoint, path, "--format", "json", "--timestamps", "--endpoints",
                                "--max-segment", "0.5")) == 0
    ((_, cut),) = read_json(capsys.readouterr().out)
    assert len(cut) >= 3 and [w for s in cut for w in s.words] == whole[0].words
    assert all(len(s.words) == 1 or s.words[-1][2] - s.start <= 0.5 + 1e-3 for s in cut)
    assert " ".join(s.text for s in cut).split() == whole[0].text.split()
    assert transcribe_main(_cli(checkpoint, path, "--format", "srt")) == 0
    (cue,) = read_subtitles(capsys.readouterr().out, "srt")
    assert cue.text == whole[0].text


def test_the_cost_benchmark_prints_each_part_beside_the_reference(causal, capsys, monkeypatch):
    """``scripts/benchmarks/streaming_cost.py --minutes 0.05`` on the tiny model: a row for the recognizer end to end,
    one per part and one for the cached transformer, and the memory and stream lines; no time asserted."""
    import importlib.util

    from cli import REPO
    data, checkpoint, files = causal
    monkeypatch.syspath_prepend(str(REPO / "scripts/benchmarks"))  # its measurement helpers, as when run as a script
    spec = importlib.util.spec_from_file_location("streaming_cost", REPO / "scripts/benchmarks/streaming_cost.py")
    streaming_cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(streaming_cost)
    assert streaming_cost.main(["--checkpoint", str(checkpoint), "--corpus-root", str(files[0].parents[3]),
                                "--minutes", "0.05", "--beam", "2", "--pause-seconds", "0.5"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:] == ["recognizer, end to end (accept_waveform)", "features", "encoder (MSSM, state carried)",
                        "search, endpoints, segments' words", "text (partial transcript)",
                        "reference: causal transformer, key/value cache capped at 10 s (encoder only)"]
    assert "process peak resident memory (VmHWM)" in out and "segments ended" in out


def test_the_cached_reference_transformer_attends_to_its_capped_left_context(monkeypatch):
    """The benchmark's reference, one layer, stepped in chunks of 8 encoder frames with a key/value cache capped at 5
    frames: each output frame equals that frame run alone from the start of its window (the 5 frames before its
    chunk, and its chunk's up to itself), with no cache."""
    import importlib.util

    from cli import REPO
    monkeypatch.syspath_prepend(str(REPO / "scripts/benchmarks"))
    spec = importlib.util.spec_from_file_location("streaming_cost", REPO / "scripts/benchmarks/streaming_cost.py")
    streaming_cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(streaming_cost)
    torch.manual_seed(0)
    model = streaming_cost.CachedCausalTransformer(16, 1, 32, 2, left_context=5).eval()
    features = torch.randn(1, 4 * 24, 80)
    cache: list = []
    stepped = torch.cat([model.step(features[:, start:start + 32], cache) for start in range(0, 96, 32)], dim=1)
    assert cache[0][0].shape[2] == 5
    truth = torch.cat([model.step(features[:, 4 * max(0, t - t % 8 - 5):4 * (t + 1)], [])[:, -1:]
                       for t in range(24)], dim=1)
    assert torch.allclose(stepped, truth, atol=1e-5)
    assert not torch.allclose(stepped, model.step(features, [])[:, :24], atol=1e-3)  # the cap changes frames 13..
