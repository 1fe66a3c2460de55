"""Many streams stepped as one batch (``Recognizer.step_streams``, ``asr.encoder.step_cache``): each stream's encoder
frames and transcripts equal its own, stepped alone, while streams join and leave at any chunk.

The encoder-level tests use random causal encoders (both streaming sub-samplers, several layers, float64); the
recognizer-level ones the tiny causal model ``test_streaming_transcriber`` trains on the mini corpus.
"""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from ssm_fairseq.asr import Recognizer
from ssm_fairseq.asr.encoder.speech_encoder import SpeechEncoder
from ssm_fairseq.asr.encoder.step_cache import CacheMismatchError, split_cache, stack_caches, stack_key
from ssm_fairseq.asr.samples import SampleRangeError
from ssm_fairseq.asr.stream import ConcurrentCallError, StreamInProgressError
from ssm_fairseq.layers.encoder_layer import LayerConfig

CAUSAL = LayerConfig(dim=32, ffn_dim=64, attention_heads=4, ssm_heads=4, ssm_state_size=4, dropout=0.0, causal=True)
FEATURES = 10


def _encoder(subsampler: str, lookahead: int = 0) -> SpeechEncoder:
    """A random causal encoder of 3 layers in float64; with ``lookahead`` frames, random look-ahead taps."""
    torch.manual_seed(0)
    encoder = SpeechEncoder("mssm", 3, CAUSAL, input_dim=FEATURES, subsampler=subsampler,
                            lookahead_frames=lookahead).double().eval()
    if lookahead:
        with torch.no_grad():
            encoder.lookahead.weight.normal_()
    return encoder


@pytest.mark.parametrize("subsampler, lookahead", [("tr", 0), ("ms", 0), ("ms", 1), ("ms", 2), ("ms", 4)])
def test_stacked_caches_step_each_stream_as_it_steps_alone(subsampler, lookahead):
    """Three streams of 72, 48 and 40 frames, starting at chunks 0, 1 and 3 (of 8 frames): each step groups the
    streams whose caches stack (``stack_key``: started or not and, with look-ahead, as many frames held and some
    frame given yet or not, which makes the layers' caches), stacks
    each group's caches and steps them as one batch, then splits them; each stream ends alone (``final``, which
    gives the frames a look-ahead holds). Every stream's output is the full forward pass over it."""
    encoder = _encoder(subsampler, lookahead)
    starts, lengths, chunk = [0, 1, 3], [72, 48, 40], 8
    features = [torch.randn(1, n, FEATURES, dtype=torch.float64) for n in lengths]
    caches: list[dict] = [{} for _ in lengths]
    outputs: list[list[torch.Tensor]] = [[] for _ in lengths]
    batch_sizes = []
    with torch.no_grad():
        for step in range(max(s + n // chunk for s, n in zip(starts, lengths))):
            live = [i for i in range(3) if 0 <= step - starts[i] < lengths[i] // chunk]
            groups: dict = {}
            for i in live:
                groups.setdefault(stack_key(caches[i]), []).append(i)
            for group in groups.values():
                batch_sizes.append(len(group))
                cache = stack_caches([caches[i] for i in group]) if caches[group[0]] else {}
                x = torch.cat([features[i][:, (step - starts[i]) * chunk:][:, :chunk] for i in group])
                out = encoder.step(x, cache)
                for i, stream_cache, rows in zip(group, split_cache(cache, len(group)), out.split(1)):
                    caches[i] = stream_cache
                    outputs[i].append(rows)
        for i, x in enumerate(features):
            assert encoder.frames_held(caches[i]) == min(lookahead, lengths[i] // 4)
            outputs[i].append(encoder.step(x[:, :0], caches[i], final=True))
            full = encoder(x, torch.tensor([x.shape[1]]))["encoder_out"]
            assert torch.allclose(torch.cat(outputs[i], dim=1), full, atol=1e-10, rtol=0)
    assert max(batch_sizes) == 3


def test_caches_at_different_points_of_their_chunking_are_refused_naming_the_entry():
    encoder = _encoder("tr")
    whole, partial = {}, {}
    with torch.no_grad():
        encoder.step(torch.randn(1, 8, FEATURES, dtype=torch.float64), whole)
        encoder.step(torch.randn(1, 6, FEATURES, dtype=torch.float64), partial)  # 2 frames wait for a group
    with pytest.raises(CacheMismatchError, match=r"cache\['subsampler'\]: entries"):
        stack_caches([whole, partial])
    with pytest.raises(ValueError, match="in a cache of 3 streams"):
        split_cache(stack_caches([whole, whole]), 3)
    assert stack_key(whole) != stack_key(partial) and stack_key(whole) == stack_key(stack_caches([whole, whole]))


def test_lookahead_caches_stack_once_their_buffers_hold_as_many_frames():
    """With 2 frames of look-ahead, a stream 1 sub-sampled frame in holds 1 and one 2 frames in holds 2 (neither has
    given a frame, so neither has layer states yet); a stream 3 frames in has given one. Only streams past their
    first 2 frames stack, however far in they are."""
    encoder = _encoder("tr", lookahead=2)
    caches = {frames: {} for frames in (1, 2, 3, 5)}
    with torch.no_grad():
        for frames, cache in caches.items():
            encoder.step(torch.randn(1, 4 * frames, FEATURES, dtype=torch.float64), cache)
    assert [encoder.frames_held(c) for c in caches.values()] == [1, 2, 2, 2]
    assert len({stack_key(caches[frames]) for frames in (1, 2, 3)}) == 3 and stack_key(caches[3]) == stack_key(
        caches[5])
    with pytest.raises(CacheMismatchError, match=r"cache\['lookahead'\]\['held'\]: tensors of shapes"):
        stack_caches([caches[1], caches[2]])
    with pytest.raises(CacheMismatchError, match=r"cache: entries"):
        stack_caches([caches[2], caches[3]])
    stack_caches([caches[3], caches[5]])


# ---- the recognizer: streams of the tiny causal model trained on the mini corpus

from test_streaming_transcriber import SEARCHES, causal  # noqa: E402,F401  (causal: the trained model's fixture)
from test_transcribe import _one_thread  # noqa: E402,F401  (an autouse fixture)

SETTINGS = dict(SEARCHES, **{"beam, no blank penalty": {"beam": 3}})


def _recording(stream):
    """Make ``stream`` keep every ``1 x m x D`` encoder output its search is given, in ``stream.encoded``."""
    stream.encoded = []
    search_frames = stream.search_frames

    def recorded(rows: torch.Tensor) -> None:
        stream.encoded.append(rows.clone())
        search_frames(rows)
    stream.search_frames = recorded
    return stream


@pytest.mark.slow
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_streams_joining_and_leaving_equal_each_stream_alone(causal, setting):
    """Four files of different lengths streamed in 320 ms chunks as one batch, joining at chunks 0, 0, 2 and 5, and
    two of them again on streams joining at chunks 1 and 9, each leaving when its audio ends; each
    stream's encoder outputs, partial and final transcripts and word times equal those of the same file streamed
    alone."""
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", **SETTINGS[setting])
    audio = [sf.read(str(path), dtype="float32")[0] for path in files]
    chunk = 5120
    pieces = [[a[i:i + chunk] for i in range(0, len(a), chunk)] for a in audio]
    alone = []
    for samples in pieces:
        stream = _recording(recognizer.stream(timestamps=True))
        partials = [stream.accept_waveform(piece) for piece in samples]
        alone.append((partials, stream.finish(), torch.cat(stream.encoded, dim=1)))
    joins = [0, 0, 2, 5, 1, 9]  # streams 4 and 5: files 2 and 3 again
    jobs = [(join, n if n < 4 else n - 2) for n, join in enumerate(joins)]
    streams = [_recording(recognizer.stream(timestamps=True)) for _ in jobs]
    partials: list[list[str]] = [[] for _ in jobs]
    finals = [None] * len(jobs)
    step, sizes = 0, []
    while any(final is None for final in finals):
        chunks = {streams[n]: pieces[f][step - join] for n, (join, f) in enumerate(jobs)
                  if 0 <= step - join < len(pieces[f])}
        sizes.append(len(chunks))
        for stream, partial in recognizer.step_streams(chunks).items():
            partials[streams.index(stream)].append(partial)
        for n, (join, f) in enumerate(jobs):
            if step - join == len(pieces[f]) - 1:
                finals[n] = streams[n].finish()
        step += 1
    assert max(sizes) >= 4
    for n, (_, f) in enumerate(jobs):
        alone_partials, alone_final, alone_encoded = alone[f]
        assert partials[n] == alone_partials
        assert finals[n].text == alone_final.text
        assert [w.word for w in finals[n].words] == [w.word for w in alone_final.words]
        assert [t for w in finals[n].words for t in w[1:]] == pytest.approx([t for w in alone_final.words
                                                                            for t in w[1:]])
        encoded = torch.cat(streams[n].encoded, dim=1)
        assert encoded.shape == alone_encoded.shape
        assert torch.allclose(encoded, alone_encoded, atol=1e-4, rtol=0)
    if setting != "beam, no blank penalty":
        assert all(final.text for final in finals)


@pytest.mark.slow
def test_streams_of_any_chunk_sizes_and_empty_chunks_step_together(causal):
    """Chunks of 100, 320 and 37 ms (and empty ones) in one step: the streams fall in different groups, and each
    still ends with its file's offline transcript."""
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", **SEARCHES["greedy"])
    offline = recognizer.transcribe(files[:3])
    audio = [sf.read(str(path), dtype="float32")[0] for path in files[:3]]
    sizes = [1600, 5120, 592]
    streams = [recognizer.stream() for _ in audio]
    positions = [0, 0, 0]
    while any(p < len(a) for p, a in zip(positions, audio)):
        chunks = {}
        for n, stream in enumerate(streams):
            chunks[stream] = audio[n][positions[n]:positions[n] + sizes[n]]  # empty once the file is done
            positions[n] += sizes[n]
        recognizer.step_streams(chunks, {stream: f"source {n}" for n, stream in enumerate(streams)})
    assert [stream.finish().text for stream in streams] == offline


@pytest.mark.slow
def test_a_bad_chunk_refuses_the_step_before_any_stream_changes(causal):
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", **SEARCHES["greedy"])
    audio = sf.read(str(files[0]), dtype="float32")[0]
    a, b = recognizer.stream(), recognizer.stream()
    recognizer.step_streams({a: audio[:3000], b: audio[:3000]}, {a: "a", b: "b"})
    accepted = (a.seconds_accepted, b.seconds_accepted)
    with pytest.raises(SampleRangeError, match="divide them by 32768") as error:
        recognizer.step_streams({a: audio[3000:6000], b: audio[3000:6000] * 32768}, {a: "a", b: "b"})
    assert "stream 1 of the step" in "".join(error.value.__notes__)
    with pytest.raises(StreamInProgressError, match="source='c'"):
        recognizer.step_streams({a: audio[3000:6000], b: audio[3000:6000]}, {a: "a", b: "c"})
    with pytest.raises(ValueError, match="1-D mono samples"):
        recognizer.step_streams({a: audio[3000:6000], b: np.stack([audio[3000:6000]] * 2)}, {a: "a", b: "b"})
    assert (a.seconds_accepted, b.seconds_accepted) == accepted
    other = Recognizer(checkpoint, device="cpu", **SEARCHES["greedy"]).stream()
    with pytest.raises(ValueError, match="belongs to another Recognizer"):
        recognizer.step_streams({a: audio[3000:6000], other: audio[:3000]})
    with b.held("a test's call"), pytest.raises(ConcurrentCallError, match="a test's call is running"):
        recognizer.step_streams({a: audio[3000:6000], b: audio[3000:6000]}, {a: "a", b: "b"})
    assert not a._lock.locked()  # the step released the streams it held
    assert (a.seconds_accepted, b.seconds_accepted) == accepted


@pytest.mark.slow
def test_a_stream_whose_features_are_not_finite_fails_alone_and_the_others_step_on(causal):
    """Three streams stepped together; at the third step the middle one's filterbank gives NaN (the transforms then
    refuse its features): it alone gets ``NonFiniteFeaturesError`` naming its position and source, inside
    ``StreamsFailedError``, whose partial transcripts are the others'; those streams go on and end with their files'
    transcripts streamed alone, and the failed stream, reset, transcribes its file afresh."""
    from ssm_fairseq.asr.features.transforms import NonFiniteFeaturesError
    from ssm_fairseq.asr.stream_batch import StreamsFailedError
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", **SEARCHES["beam"])
    audio = [sf.read(str(path), dtype="float32")[0] for path in files[:3]]
    alone = []
    for samples in audio:
        stream = recognizer.stream()
        partials = [stream.accept_waveform(samples[i:i + 5120]) for i in range(0, len(samples), 5120)]
        alone.append((partials, stream.finish().text))
    streams = [recognizer.stream() for _ in audio]
    sources = {stream: f"call {n}" for n, stream in enumerate(streams)}
    steps = max(-(-len(samples) // 5120) for samples in audio)
    partials: list[list[str]] = [[] for _ in audio]
    for step in range(steps):
        chunks = {stream: samples[step * 5120:(step + 1) * 5120] for stream, samples in zip(streams, audio)
                  if step * 5120 < len(samples) and not (step > 2 and stream is streams[1])}
        if step == 2:
            accept = streams[1].filterbank.accept_waveform
            streams[1].filterbank.accept_waveform = lambda samples: accept(samples) * np.nan
            with pytest.raises(StreamsFailedError) as failed:
                recognizer.step_streams(chunks, sources)
            (stream, error), = failed.value.errors.items()
            assert stream is streams[1] and isinstance(error, NonFiniteFeaturesError)
            assert "stream 1 of the step, source 'call 1'" in str(failed.value)
            result = failed.value.partials
            assert set(result) == {streams[0], streams[2]}
        else:
            result = recognizer.step_streams(chunks, sources)
        for n, stream in enumerate(streams):
            if stream in result:
                partials[n].append(result[stream])
    for n in (0, 2):
        assert partials[n] == alone[n][0]
        assert streams[n].finish().text == alone[n][1]
    streams[1].reset()
    assert streams[1].stream_file(files[1], 320).text == alone[1][1]


@pytest.mark.slow
def test_the_benchmark_prints_a_row_per_number_of_streams_with_the_same_transcripts(causal, capsys, monkeypatch):
    """``scripts/benchmarks/many_streams.py`` on the tiny model, briefly: a row for each number of streams, the
    transcripts the same batched and one by one."""
    import importlib.util

    from cli import REPO
    data, checkpoint, files = causal
    monkeypatch.syspath_prepend(str(REPO / "scripts/benchmarks"))  # its measurement helpers, as when run as a script
    spec = importlib.util.spec_from_file_location("many_streams", REPO / "scripts/benchmarks/many_streams.py")
    many_streams = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(many_streams)
    corpus = files[0].parents[3]
    assert many_streams.main(["--checkpoint", str(checkpoint), "--corpus-root", str(corpus), "--streams", "1", "3",
                              "--seconds", "1.5", "--beam", "2", "--threads", "1"]) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.split("|")[0].strip().isdigit()]
    assert [int(row[0]) for row in rows] == [1, 3]
    assert all(row[3].split()[0] == "yes" for row in rows)
