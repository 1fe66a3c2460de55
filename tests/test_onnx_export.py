"""ONNX export of a transducer (``ssm_fairseq.deploy``): the exported encoder step equals the PyTorch step over a
stream of chunks (and the whole-utterance forward), and so does each SSM block's chunk form with every gating; the
offline (bidirectional) encoder graph equals the PyTorch forward at any length; the predictor and joiner equal theirs,
every file passes ``onnx.checker``, int8 keeps the SSM matrices in float32, and models that cannot stream or bad
settings are refused, named, with nothing left behind.

Tiny untrained models built in memory (``onnx_tiny_model``); exports take a few seconds each.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from ssm_fairseq.deploy.chunk_layers import ChunkMultiHeadSSM
from ssm_fairseq.deploy.errors import NotStreamableError, UnsupportedModelError
from ssm_fairseq.deploy.export_graphs import EncoderChunkStep
from ssm_fairseq.deploy.exporter import export_model
from ssm_fairseq.deploy.manifest import GRAPHS, METADATA_KEY, graph_file, read_manifest
from ssm_fairseq.deploy.onnx_transducer import OnnxTransducer
from ssm_fairseq.layers.state_space.multihead_ssm import MultiHeadSSM

from onnx_tiny_model import metadata_of, tiny_model

CHUNK = 32


@pytest.fixture(scope="module", params=["tr", "ms"])
def exported(request, tmp_path_factory):
    """(model, directory) of a tiny causal model on the tr or ms sub-sampler, exported with int8 copies."""
    model = tiny_model(request.param)
    out = tmp_path_factory.mktemp(f"export_{request.param}") / "exported"
    export_model(model, metadata_of(model, None), out, CHUNK, int8=True)
    return model, out


def test_encoder_step_equals_pytorch_over_a_stream_of_chunks(exported):
    """Four chunks, the last one partial (5 frames): every encoder frame and every state as PyTorch's ``step``
    (fp32, 1e-4), and the frames as ``forward`` on the whole stream."""
    model, out = exported
    onnx_model = OnnxTransducer(out)
    features = torch.randn(1, 3 * CHUNK + 5, 80, generator=torch.Generator().manual_seed(1))
    cache, expected, got, states = {}, [], [], onnx_model.initial_states()
    with torch.no_grad():
        for start in range(0, features.shape[1], CHUNK):
            piece = features[:, start:start + CHUNK]
            final = start + CHUNK >= features.shape[1]
            expected.append(model.encoder.step(piece, cache, final=final)[0].numpy())
            encoder_out, _, next_states = onnx_model.encode_chunk(piece[0].numpy(), states)
            got.append(encoder_out)
            if not final:  # the states after a full chunk are the stream's
                torch_states = [s.numpy() for layer in _layer_caches(cache) for s in layer]
                assert len(torch_states) == len(next_states)
                for a, b in zip(next_states, torch_states):
                    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
            states = next_states
        whole = model.encoder(features, torch.tensor([features.shape[1]]))["encoder_out"][0].numpy()
    assert [g.shape for g in got] == [e.shape for e in expected]
    np.testing.assert_allclose(np.concatenate(got), np.concatenate(expected), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(np.concatenate(got), whole, atol=1e-4, rtol=1e-4)


def _layer_caches(cache: dict):
    """The SSM states of a ``SpeechEncoder.step`` cache in the order the exported graph takes them: the multi-scale
    sub-sampler's layers, then the encoder's."""
    sub = cache.get("subsampler", {})
    layers = [sub[key] for key in sorted(k for k in sub if isinstance(k, tuple))]
    layers += [cache[key] for key in sorted(k for k in cache if isinstance(k, int))]
    for layer in layers:
        for block in layer.values():
            yield block.get("states", [])


def test_predictor_and_joiner_equal_pytorch(exported):
    model, out = exported
    onnx_model = OnnxTransducer(out)
    g = torch.Generator().manual_seed(2)
    tokens = torch.tensor([0, 4, 7, 9])
    h, c = torch.randn(2, 4, 16, generator=g), torch.randn(2, 4, 16, generator=g)
    proj, next_h, next_c = onnx_model.predictor_step(tokens.numpy(), h.numpy(), c.numpy())
    with torch.no_grad():
        out_t, state = model.predictor(tokens.unsqueeze(1), [(h[i:i + 1], c[i:i + 1]) for i in range(2)])
        proj_t = model.joiner.predictor_proj(out_t[:, 0])
        enc = torch.randn(4, 24, generator=g)
        logits_t = model.joiner.step(enc, proj_t).log_softmax(-1)
    np.testing.assert_allclose(proj, proj_t.numpy(), atol=1e-5)
    np.testing.assert_allclose(next_h, torch.cat([s[0] for s in state]).numpy(), atol=1e-5)
    np.testing.assert_allclose(next_c, torch.cat([s[1] for s in state]).numpy(), atol=1e-5)
    np.testing.assert_allclose(onnx_model.joint_log_probs(enc.numpy(), proj), logits_t.numpy(), atol=1e-5)


def test_every_file_passes_the_checker_and_carries_the_metadata(exported):
    model, out = exported
    metadata = read_manifest(out, "int8")
    assert metadata["chunk_frames"] == CHUNK and metadata["blank"] == model.blank
    assert metadata["vocabulary"] == list(model.dictionary.symbols)
    assert len(metadata["state_shapes"]) == len(metadata["state_names"]) > 0
    for precision in ("fp32", "int8"):
        for graph in GRAPHS:
            path = out / graph_file(graph, precision)
            onnx.checker.check_model(str(path), full_check=True)
            carried = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
            assert json.loads(carried[METADATA_KEY])["export_id"] == metadata["export_id"]
    # the int8 encoder quantizes weights: it runs, and stays near fp32 on this chunk (with signed weights, on an x86 CPU
    # without VNNI the integer products saturated: mean errors of 33-130% of the outputs' magnitude)
    fp32, int8 = OnnxTransducer(out), OnnxTransducer(out, "int8")
    assert any(i.name.endswith("_quantized") for i in onnx.load(str(out / "encoder.int8.onnx")).graph.initializer)
    features = np.random.default_rng(0).standard_normal((CHUNK, 80)).astype(np.float32)
    a, _, _ = fp32.encode_chunk(features, fp32.initial_states())
    b, _, _ = int8.encode_chunk(features, int8.initial_states())
    assert 0 < np.abs(a - b).max() < 0.5 and np.abs(a - b).mean() < 0.1 * np.abs(a).mean()


@pytest.mark.parametrize("subsampler, causal", [("tr", False), ("ms", False), ("conv", True)])
def test_a_model_that_cannot_stream_is_refused_and_nothing_is_written(tmp_path, subsampler, causal):
    model = tiny_model(subsampler, causal)
    with pytest.raises(NotStreamableError, match="chunk by chunk"):
        export_model(model, metadata_of(model, None), tmp_path / "out", CHUNK)
    assert list(tmp_path.iterdir()) == []


def test_bad_chunks_and_an_existing_directory_are_refused(tmp_path):
    model = tiny_model("ms")
    with pytest.raises(ValueError, match="multiple of the sub-sampling stride"):
        EncoderChunkStep(model.encoder, model.joiner.encoder_proj, 30)
    with pytest.raises(ValueError, match="at most 64"):
        EncoderChunkStep(model.encoder, model.joiner.encoder_proj, 128)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="--overwrite"):
        export_model(model, metadata_of(model, None), tmp_path / "out", CHUNK)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    export_model(model, metadata_of(model, None), tmp_path / "out", CHUNK, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert not (tmp_path / "out" / "keep.txt").exists()
    read_manifest(tmp_path / "out")


def test_an_interrupted_export_leaves_nothing(tmp_path, monkeypatch):
    """A failure after the graphs are written (here: in the manifest) leaves neither ``out`` nor its temporary."""
    import ssm_fairseq.deploy.exporter as exporter

    def failing(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(exporter, "write_manifest", failing)
    model = tiny_model("tr")
    with pytest.raises(OSError, match="disk full"):
        export_model(model, metadata_of(model, None), tmp_path / "out", CHUNK)
    assert list(tmp_path.iterdir()) == []


def test_onnx_runtime_session_options_do_not_change_results(exported):
    """One intra-op thread gives the same encoder frames as the default."""
    _, out = exported
    features = np.random.default_rng(3).standard_normal((CHUNK, 80)).astype(np.float32)
    a = OnnxTransducer(out).encode_chunk(features, OnnxTransducer(out).initial_states())[0]
    one = OnnxTransducer(out, threads=1)
    np.testing.assert_allclose(one.encode_chunk(features, one.initial_states())[0], a, atol=1e-5)
    assert isinstance(one.sessions["encoder"], ort.InferenceSession)


@pytest.mark.parametrize("gating, heads", [("ihg", 4), ("glu", 2), ("gelu", 1)])
def test_the_chunk_form_of_an_ssm_block_equals_its_step(gating, heads):
    """``ChunkMultiHeadSSM`` (one matrix product per stage, the export's layout) against ``MultiHeadSSM.step`` over
    three chunks, with each gating (and without the multi-head projection, one head)."""
    torch.manual_seed(4)
    ssm = MultiHeadSSM(16, heads=heads, stack=2, gating=gating, state_size=4, kernel="mssm").eval()
    chunks = torch.randn(3, 1, 8, 16)
    with torch.no_grad():
        cache: dict = {}
        expected = [ssm.step(chunk, cache) for chunk in chunks]
        form = ChunkMultiHeadSSM(ssm, cache["recurrences"], 8)
        states = [torch.zeros(1, 16, 4) for _ in range(2)]
        for chunk, want in zip(chunks, expected):
            got, states = form(chunk[0], states)
            torch.testing.assert_close(got, want[0], atol=1e-5, rtol=1e-5)
        for a, b in zip(states, cache["states"]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_int8_keeps_the_chunk_matrices_in_float32(exported):
    """Only the Linear layers' weights are quantized: every SSM stage's chunk product stays a float32 ``MatMul``."""
    _, out = exported
    fp32, int8 = onnx.load(str(out / "encoder.onnx")), onnx.load(str(out / "encoder.int8.onnx"))
    matrices = {i.name for i in fp32.graph.initializer if len(i.dims) == 3}
    assert matrices and matrices <= {i.name for i in int8.graph.initializer}
    products = [n for n in int8.graph.node if n.op_type == "MatMul" and set(n.input) & matrices]
    assert len(products) == len(matrices)
    assert sum(n.op_type == "MatMulInteger" for n in int8.graph.node) > 0


def test_an_encoder_with_look_ahead_is_refused():
    model = tiny_model("tr")
    model.encoder.lookahead_frames = 2  # what --lookahead-frames sets (its module is not needed to be refused)
    with pytest.raises(NotStreamableError, match="look-ahead"):
        EncoderChunkStep(model.encoder, model.joiner.encoder_proj, CHUNK)


@pytest.mark.parametrize("subsampler", ["tr", "conv"])
def test_the_offline_encoder_equals_pytorch_at_any_length(tmp_path, subsampler):
    """``--offline``: a bidirectional model's whole-utterance graph (chunked convolutions, no FFT) against
    ``SpeechEncoder.forward`` (FFT convolutions) at lengths shorter than a piece, between pieces and of many pieces
    (fp32, 1e-4); the files pass the checker and say which encoder they hold."""
    model = tiny_model(subsampler, causal=False)
    out = tmp_path / "offline"
    export_model(model, metadata_of(model, None), out, int8=True, offline=True, piece_frames=8)
    metadata = read_manifest(out, "int8")
    assert metadata["encoder"] == "offline" and metadata["piece_frames"] == 8 and "state_shapes" not in metadata
    for precision in ("fp32", "int8"):
        for graph in GRAPHS:
            onnx.checker.check_model(str(out / graph_file(graph, precision)), full_check=True)
    onnx_model = OnnxTransducer(out)
    session = onnx_model.sessions["encoder"]
    for frames in (23, 64, 150, 701):
        features = torch.randn(1, frames, 80, generator=torch.Generator().manual_seed(frames))
        with torch.no_grad():
            expected = model.encoder(features, torch.tensor([frames]))["encoder_out"]
            proj = model.joiner.encoder_proj(expected)
        encoder_out, = session.run(["encoder_out"], {"features": features.numpy()})
        np.testing.assert_allclose(encoder_out, expected.numpy(), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(onnx_model.encode_utterance(features[0].numpy()), proj[0].numpy(), atol=1e-4,
                                   rtol=1e-4)
    with pytest.raises(ValueError, match="offline"):
        onnx_model.encoder_stream()


def test_the_offline_export_refuses_what_it_has_no_graph_for(tmp_path):
    model = tiny_model("ms", causal=False)
    with pytest.raises(UnsupportedModelError, match="ms sub-sampler"):
        export_model(model, metadata_of(model, None), tmp_path / "out", offline=True)
    assert list(tmp_path.iterdir()) == []


def test_the_command_takes_a_chunk_length_or_a_piece_length_not_both(tmp_path, capsys):
    from ssm_fairseq.cli.export_onnx import main as export_main

    for flags in (["--offline", "--chunk-frames", "32"], ["--piece-frames", "8"]):
        assert export_main(["--checkpoint", str(tmp_path / "none.pt"), "--out", str(tmp_path / "out"), *flags]) == 1
        assert "not both" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
