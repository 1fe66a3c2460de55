"""Streaming with look-ahead (``--lookahead-frames K``) through the recognizer: streamed = offline with the same K,
many streams stepped together = each alone, encoder resets at endpoints, the latency reported, and checkpoints
without the option loading as before.

The models are the tiny causal model ``test_streaming_transcriber`` trains on the mini corpus, given a look-ahead
layer with random future taps (``_with_lookahead``): a trained model whose encoder frames each depend on the next K
frames, without training one per K. The encoder-level tests (random encoders, ``ms`` sub-sampler, several layers,
K = 1, 2, 4) are in ``test_streaming_encoder.py`` and ``test_stream_batch.py``.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import soundfile as sf
import torch

from ssm_fairseq.asr import Recognizer

from test_endpoints import segments_with_resets
from test_stream_batch import _recording
from test_streaming_transcriber import SEARCHES, causal  # noqa: F401  (causal: the trained model's fixture)
from test_transcribe import _one_thread  # noqa: F401  (an autouse fixture)

pytestmark = pytest.mark.slow

SETTINGS = dict(SEARCHES, **{"beam, no blank penalty": {"beam": 3}})
LOOKAHEADS = (1, 2, 4)


def _with_lookahead(checkpoint: Path, out: Path, frames: int) -> Path:
    """``checkpoint`` (a causal model without look-ahead) saved to ``out`` as a model with ``frames`` frames of
    look-ahead: the option in its config and a look-ahead layer of random future taps (0.3 x N(0, 1); the current
    frame's tap 1) in its weights."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    state["cfg"]["model"]["lookahead_frames"] = frames
    dim = state["model"]["encoder.final_norm.weight"].shape[0]
    weight = torch.zeros(dim, frames + 1)
    weight[:, 0] = 1.0
    weight[:, 1:] = 0.3 * torch.randn(dim, frames, generator=torch.Generator().manual_seed(frames))
    state["model"]["encoder.lookahead.weight"] = weight
    torch.save(state, out)
    return out


@pytest.fixture(scope="module")
def lookahead(causal, tmp_path_factory) -> tuple[dict[int, Path], list[Path]]:
    """({K: checkpoint with K frames of look-ahead} for K = 1, 2, 4, the 4 test-mini files)."""
    data, checkpoint, files = causal
    root = tmp_path_factory.mktemp("lookahead")
    return {k: _with_lookahead(checkpoint, root / f"lookahead{k}.pt", k) for k in LOOKAHEADS}, files


@pytest.mark.parametrize("frames", LOOKAHEADS)
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_streamed_in_any_chunks_equals_offline_with_the_same_lookahead(lookahead, frames, setting):
    checkpoints, files = lookahead
    recognizer = Recognizer(checkpoints[frames], device="cpu", **SETTINGS[setting])
    offline = recognizer.transcribe(files, timestamps=True)
    stream = recognizer.stream(timestamps=True)
    assert stream.lookahead_seconds == pytest.approx(frames * 0.04)
    for chunk_ms in (10, 80, 320):  # 80 ms: 2 encoder frames, fewer than the look-ahead holds at K = 4
        streamed = [stream.stream_file(path, chunk_ms) for path in files]
        assert [t.text for t in streamed] == [t.text for t in offline]
        for s, o in zip(streamed, offline):
            assert [w.word for w in s.words] == [w.word for w in o.words]
            assert [t for w in s.words for t in w[1:]] == pytest.approx([t for w in o.words for t in w[1:]])
    if setting != "beam, no blank penalty":
        assert all(t.text for t in offline)
    loaded = recognizer.model.encoder.lookahead.weight
    saved = torch.load(checkpoints[frames], map_location="cpu", weights_only=False)["model"]["encoder.lookahead.weight"]
    assert torch.equal(loaded.cpu(), saved) and saved[:, 1:].abs().min() > 0  # the random taps, loaded


@pytest.mark.parametrize("frames", [2, 4])
def test_streams_stepped_together_equal_each_stream_alone_with_lookahead(lookahead, frames):
    """Three files in 80 ms chunks (2 encoder frames) as one batch, joining at chunks 0, 1 and 3 and leaving when
    their audio ends: a stream whose look-ahead is still filling cannot stack with one whose look-ahead is full,
    so streams step in several groups; each stream's encoder outputs, partial and final transcripts equal its own
    streamed alone, and its final transcript is offline's."""
    checkpoints, files = lookahead
    recognizer = Recognizer(checkpoints[frames], device="cpu", **SETTINGS["beam"])
    audio = [sf.read(str(path), dtype="float32")[0] for path in files[:3]]
    chunk = 1280
    pieces = [[a[i:i + chunk] for i in range(0, len(a), chunk)] for a in audio]
    alone = []
    for samples in pieces:
        stream = _recording(recognizer.stream())
        partials = [stream.accept_waveform(piece) for piece in samples]
        alone.append((partials, stream.finish().text, torch.cat(stream.encoded, dim=1)))
    joins = [0, 1, 3]
    streams = [_recording(recognizer.stream()) for _ in joins]
    partials: list[list[str]] = [[] for _ in joins]
    finals: list[str | None] = [None] * len(joins)
    step = 0
    while any(final is None for final in finals):
        chunks = {streams[n]: pieces[n][step - join] for n, join in enumerate(joins)
                  if 0 <= step - join < len(pieces[n])}
        for stream, partial in recognizer.step_streams(chunks).items():
            partials[streams.index(stream)].append(partial)
        for n, join in enumerate(joins):
            if step - join == len(pieces[n]) - 1:
                finals[n] = streams[n].finish().text
        step += 1
    assert finals == [text for _, text, _ in alone] == recognizer.transcribe(files[:3])
    for n in range(len(joins)):
        assert partials[n] == alone[n][0]
        encoded = torch.cat(streams[n].encoded, dim=1)
        assert encoded.shape == alone[n][2].shape
        assert torch.allclose(encoded, alone[n][2], atol=1e-4, rtol=0)


@pytest.mark.parametrize("frames", [2, 4])
def test_an_encoder_reset_at_an_endpoint_starts_at_the_segments_first_frame(lookahead, frames):
    """``reset_encoder`` with look-ahead: the new encoder starts at the segment's first frame, taking again the
    feature frames whose encoder frames the old one still held, and the segment before looked ahead into them.
    So each segment's text is a fresh search over a fresh encoder's frames of the features from its first frame to
    ``K`` encoder frames past its last (the stream's end for the last segment), cut to the segment's frames."""
    checkpoints, files = lookahead
    recognizer = Recognizer(checkpoints[frames], device="cpu", **SETTINGS["beam"])
    segments = segments_with_resets(recognizer, files[0])
    features = recognizer.features(files[0]).unsqueeze(0)
    stride, frame = recognizer.encoder_stride, recognizer.frame_seconds
    bounds = [round(s.start / frame) for s in segments] + [None]
    texts = []
    for first, last in zip(bounds, bounds[1:]):
        end = features.shape[1] if last is None else min(features.shape[1], (last + frames) * stride)
        with torch.no_grad():
            encoded = recognizer.model.encoder(features[:, first * stride:end],
                                               torch.tensor([end - first * stride]))["encoder_out"]
        search = recognizer.generator.search(1, recognizer.device)
        search.advance(encoded if last is None else encoded[:, :last - first])
        (best, *_), = search.finish(1, recognizer.generator.length_norm)
        texts.append(recognizer.text(best.tokens))
    assert [s.text for s in segments] == texts


def test_checkpoints_without_the_option_load_as_before(causal, tmp_path):
    """A checkpoint saved before ``--lookahead-frames`` existed (its model config without the field) loads with no
    look-ahead (no layer, no parameters, no latency) and transcribes as the same checkpoint with the field at 0."""
    data, checkpoint, files = causal
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert state["cfg"]["model"]["lookahead_frames"] == 0
    del state["cfg"]["model"]["lookahead_frames"]
    earlier = tmp_path / "earlier.pt"
    torch.save(state, earlier)
    recognizer = Recognizer(earlier, device="cpu", **SETTINGS["greedy"])
    encoder = recognizer.model.encoder
    assert encoder.lookahead_frames == 0 and not hasattr(encoder, "lookahead")
    assert recognizer.stream().lookahead_seconds == 0.0
    assert set(recognizer.model.state_dict()) == set(state["model"])
    assert recognizer.transcribe(files) == Recognizer(checkpoint, device="cpu", **SETTINGS["greedy"]).transcribe(files)
