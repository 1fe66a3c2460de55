"""Language-model fusion while streaming: a real ``Stream`` (filterbank, causal encoder, search) with an LM fused
decodes as the offline recognizer with the same LM, in every search (greedy, beam, modified beam), with shallow
fusion and with LODR (a bigram of internal-LM estimate subtracted), in chunks from 10 ms to 1 s; with endpoints, each
segment's search and its LM start afresh, so each segment is a fresh fused search over its own frames.

The LMs: ``CountingBigramDecoder`` (``test_lm_fusion``: its scores depend on the sum of the whole context, carried
in its incremental state, so a state carried wrongly across chunks or segments changes them) and a random
``spade_lm`` (step mode: fixed-size states), both over the tiny causal model's dictionary. The comparison is of the
final hypotheses themselves (units, emission frames, fused scores), not only their texts.
"""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from ssm_fairseq.asr import Recognizer
from ssm_fairseq.asr.endpoints import EndpointRules
from ssm_fairseq.asr.search.bigram_lm import BigramLM

from spade_cases import SMALL, build
from test_lm_fusion import bigram_lm
from test_streaming_transcriber import causal  # noqa: F401  (the trained tiny causal model's fixture)
from test_transcribe import _one_thread  # noqa: F401  (an autouse fixture)

pytestmark = pytest.mark.slow

# A blank penalty far above the logits' spread makes the tiny model emit labels (test_streaming_transcriber's);
# one label per frame with a beam is modified beam search.
SEARCHES = {"greedy": {"beam": 1, "max_symbols_per_frame": 2, "blank_penalty": 20.0},
            "beam": {"beam": 3, "max_symbols_per_frame": 2, "blank_penalty": 20.0},
            "modified beam": {"beam": 3, "max_symbols_per_frame": 1, "blank_penalty": 20.0}}
FUSIONS = ("counting bigram", "spade_lm", "counting bigram with LODR")
CHUNKS_MS = (10, 320, 1000)  # 10 ms: less than a filterbank window


def fuse(recognizer: Recognizer, fusion: str) -> None:
    """Give ``recognizer``'s generator the LM (and for LODR a bigram of random sequences) of ``fusion``, over its
    dictionary's size."""
    vocab = len(recognizer.dictionary)
    generator = recognizer.generator
    if fusion == "spade_lm":
        torch.manual_seed(3)
        generator.lm_model, generator.lm_weight = build("spade_lm", *SMALL, vocab_size=vocab)[0].float().eval(), 1.5
    else:
        generator.lm_model, generator.lm_weight = bigram_lm(vocab, seed=1, sharpness=6.0).float(), 2.0
    if fusion.endswith("LODR"):
        rng = np.random.default_rng(5)
        sequences = [rng.integers(4, vocab, rng.integers(1, 8)).tolist() for _ in range(40)]
        units = generator.lm_model.decoder.dictionary  # the fusion checks the bigram's units against the LM's
        generator.ilm = BigramLM.from_sequences(sequences, units.symbols, 0.5, units.eos())
        generator.ilm_weight = 0.7


def record_finished(recognizer: Recognizer, monkeypatch) -> list[tuple[int, object]]:
    """From now on, every search ``recognizer.generator`` makes records, when finished, ``(frames it searched, its
    best hypothesis)`` into the returned list (a stream with endpoints finishes one search per segment)."""
    finished = []
    make = recognizer.generator.search

    def search(batch, device):
        made = make(batch, device)
        finish = made.finish

        def recorded(*args, **kwargs):
            result = finish(*args, **kwargs)
            finished.append((made.frames_done[0], result[0][0]))
            return result
        made.finish = recorded
        return made
    monkeypatch.setattr(recognizer.generator, "search", search)
    return finished


def offline_encoded(recognizer: Recognizer, path) -> torch.Tensor:
    """``1 x T x D``: the whole file's encoder output in one call."""
    frames = recognizer.features(path).unsqueeze(0)
    with torch.no_grad():
        return recognizer.model.encoder(frames, torch.tensor([frames.shape[1]]))["encoder_out"]


def one_call_search(recognizer: Recognizer, encoded: torch.Tensor):
    """The best hypothesis of one search (the generator's, with its LM) over ``1 x T x D`` frames."""
    search = recognizer.generator.search(1, recognizer.device)
    search.advance(encoded)
    (best, *_), = search.finish(1, recognizer.generator.length_norm)
    return best


def assert_same_hypothesis(streamed, offline) -> None:
    assert streamed.tokens == offline.tokens
    assert streamed.frames == offline.frames
    assert streamed.score == pytest.approx(offline.score, abs=1e-3)  # float32 encoders, streamed and whole


@pytest.mark.parametrize("fusion", FUSIONS)
@pytest.mark.parametrize("search", sorted(SEARCHES))
def test_streamed_with_an_lm_equals_offline_with_it(causal, monkeypatch, search, fusion):
    """Each file streamed in 10 ms, 320 ms and 1 s chunks with the LM fused: the transcript and word times of the
    offline (batched) recognizer with the same LM, and the final hypothesis (units, frames, fused score) of one
    fused search over the file's whole encoder output. The LM changes some transcript (it is in the search)."""
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", **SEARCHES[search])
    plain = recognizer.transcribe(files)
    fuse(recognizer, fusion)
    offline = recognizer.transcribe(files, timestamps=True)
    assert all(t.text for t in offline) and [t.text for t in offline] != plain
    whole = [one_call_search(recognizer, offline_encoded(recognizer, path)) for path in files]
    assert [recognizer.text(best.tokens) for best in whole] == [t.text for t in offline]
    finished = record_finished(recognizer, monkeypatch)
    stream = recognizer.stream(timestamps=True)
    for chunk_ms in CHUNKS_MS:
        finished.clear()
        streamed = [stream.stream_file(path, chunk_ms) for path in files]
        assert [t.text for t in streamed] == [t.text for t in offline]
        for s, o in zip(streamed, offline):
            assert [w.word for w in s.words] == [w.word for w in o.words]
            assert [t for w in s.words for t in w[1:]] == pytest.approx([t for w in o.words for t in w[1:]])
        assert len(finished) == len(files)
        for (_, best), expected in zip(finished, whole):
            assert_same_hypothesis(best, expected)


@pytest.mark.parametrize("fusion", ("counting bigram", "spade_lm"))
@pytest.mark.parametrize("search", sorted(SEARCHES))
def test_with_endpoints_each_segment_is_a_fresh_fused_search_over_its_frames(causal, monkeypatch, search, fusion):
    """Two files joined, streamed with the LM fused, cut every 0.5 s (rule 3), in 160 ms and 320 ms chunks: the
    segments' searches cover the joined audio's encoder frames end to end, and each one's final hypothesis (units,
    frames, fused score) is that of a fresh fused search over its frames of the whole audio's encoder output (the
    encoder carries on, the search and its LM context restart from ``</s>``); every kept segment's text is its
    hypothesis's."""
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", **SEARCHES[search])
    fuse(recognizer, fusion)
    samples = np.concatenate([sf.read(str(path), dtype="float32")[0] for path in files[:2]])
    joined = data.parent / f"joined-{search.replace(' ', '-')}-{fusion.replace(' ', '-')}.flac"
    sf.write(str(joined), samples, 16000)
    encoded = offline_encoded(recognizer, joined)
    finished = record_finished(recognizer, monkeypatch)
    for chunk_ms in (160, 320):
        finished.clear()
        segments = recognizer.stream(endpoints=EndpointRules(max_segment=0.5)).stream_file_segments(joined, chunk_ms)
        streamed = list(finished)  # the fresh searches below record too
        assert len(streamed) >= 4 and len(segments) >= 2
        assert sum(frames for frames, _ in streamed) == encoded.shape[1]
        start, kept = 0, []
        for frames, best in streamed:
            assert_same_hypothesis(best, one_call_search(recognizer, encoded[:, start:start + frames]))
            text = recognizer.text(best.tokens)
            if text and not (start > 0 and all(frame == 0 for frame in best.frames)):  # Stream._prior_only
                kept.append(text)
            start += frames
        assert [s.text for s in segments] == kept
