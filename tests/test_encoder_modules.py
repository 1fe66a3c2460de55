"""MSSM blocks, encoder layers and sub-samplers: gating, direction, padding invariance."""
from __future__ import annotations

import itertools

import pytest
import torch

from ssm_fairseq.layers.state_space.bidirectional_ssm import BidirectionalSSM
from ssm_fairseq.layers.encoder_layer import LAYER_TYPES, LayerConfig
from ssm_fairseq.layers.state_space.multihead_ssm import MultiHeadSSM
from ssm_fairseq.asr.encoder.speech_encoder import SpeechEncoder
from ssm_fairseq.asr.encoder.subsampling import SUBSAMPLERS, ConvSubsampler, time_reduction
from ssm_fairseq.ssm import MSSMKernel

SMALL = LayerConfig(dim=32, ffn_dim=64, attention_heads=4, ssm_heads=4, ssm_state_size=4,
                    s4_l_max=256, dropout=0.0)


def _direct_conv(u, K, D, reverse=False):
    """``B x H x L`` input, ``C x H x L`` kernel -> ``B x C x H x L`` by explicit sums over taps."""
    L = u.shape[-1]
    y = torch.zeros(u.shape[0], K.shape[0], u.shape[1], L, dtype=u.dtype)
    for k in range(L):
        taps = range(k, L) if reverse else range(k + 1)
        for j in taps:
            y[..., k] += K[None, :, :, abs(k - j)] * u[:, None, :, j]
    return y + D[None, :, :, None] * u[:, None]


@pytest.mark.parametrize("gating", ["ihg", "glu", "gelu"])
def test_multihead_ssm_stage_equals_its_definition(gating):
    ssm = MultiHeadSSM(8, heads=4, stack=1, gating=gating, state_size=4).double()
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    u = ssm.in_proj(x).transpose(1, 2)
    K, D = ssm.kernels[0](9)
    y = _direct_conv(u, K, D)  # B x C x 8 x L; head h holds channels 2h, 2h+1
    if gating == "gelu":
        a = torch.nn.functional.gelu(y[:, 0])
    elif gating == "glu":
        a = y[:, 0] * torch.sigmoid(y[:, 1])
    else:  # Eq. 9: head h (h < 2) gated by head h + 2, both outputs c; laid out as (c, h, channel)
        a = torch.stack([y[:, c, 2 * h + n] * torch.sigmoid(y[:, c, 2 * (h + 2) + n])
                         for c in range(2) for h in range(2) for n in range(2)], dim=1)
    expected = ssm.linears[0](a.transpose(1, 2))
    assert torch.allclose(ssm(x), expected, atol=1e-10)


def test_stacked_stages_have_separate_parameters_and_one_projection():
    ssm = MultiHeadSSM(8, heads=4, stack=3, gating="ihg", state_size=4)
    assert len(ssm.kernels) == 3 and len(ssm.linears) == 3 and ssm.in_proj is not None
    assert ssm.kernels[0].C.data_ptr() != ssm.kernels[1].C.data_ptr()
    assert MultiHeadSSM(8, heads=1).in_proj is None


def test_directions_are_causal_and_anticausal():
    torch.manual_seed(1)
    forward = MultiHeadSSM(8, heads=2, stack=2, gating="ihg").double()
    backward = MultiHeadSSM(8, heads=2, reverse=True).double()
    x = torch.randn(1, 20, 8, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 12:] = torch.randn(1, 8, 8)
    assert torch.allclose(forward(x)[:, :12], forward(x2)[:, :12], atol=1e-10)
    assert not torch.allclose(forward(x)[:, 12:], forward(x2)[:, 12:], atol=1e-3)
    x3 = x.clone()
    x3[:, :5] = torch.randn(1, 5, 8)
    assert torch.allclose(backward(x)[:, 5:], backward(x3)[:, 5:], atol=1e-10)
    assert not torch.allclose(backward(x)[:, :5], backward(x3)[:, :5], atol=1e-3)


def test_backward_branch_is_the_reversed_forward_ssm_of_the_reversed_input():
    block = BidirectionalSSM(8, heads=2, stack=2, gating="ihg", state_size=4)
    mirror = MultiHeadSSM(8, heads=2, stack=2, gating="ihg", state_size=4, output_linear=False)
    mirror.load_state_dict(block.backward_ssm.state_dict())
    x = torch.randn(2, 15, 8)
    assert torch.allclose(block.backward_ssm(x), mirror(x.flip(1)).flip(1), atol=1e-5)


def test_block_with_kernels_generated_together_equals_kernels_generated_one_by_one(monkeypatch):
    from ssm_fairseq.ssm import batched_kernels

    monkeypatch.setattr(batched_kernels, "BATCHED_DEVICES", ("cpu",))  # the GPU's path, here on CPU
    calls = []
    monkeypatch.setattr(batched_kernels, "batched_kernels",
                        lambda kernels, L, inner=batched_kernels.batched_kernels: calls.append(len(kernels))
                        or inner(kernels, L))
    torch.manual_seed(0)
    block = BidirectionalSSM(8, heads=2, stack=2, gating="ihg", state_size=4).double()
    x = torch.randn(2, 15, 8, dtype=torch.float64)
    padding_mask = torch.zeros(2, 15, dtype=torch.bool)
    padding_mask[1, 11:] = True

    def output_and_grads(kernels):
        block.zero_grad()
        if kernels is None:  # the block's own path: all four kernels in one generation
            y = block(x, padding_mask)
        else:
            y = block.out_proj(torch.cat([block.forward_ssm(x, padding_mask, kernels[0]),
                                          block.backward_ssm(x, padding_mask, kernels[1])], dim=-1))
        y = y.masked_fill(padding_mask.unsqueeze(-1), 0.0)  # padded frames' outputs are not the block's concern
        y.square().sum().backward()
        return y.detach(), [p.grad.clone() for p in block.parameters()]

    separate = [[k(15) for k in ssm.kernels] for ssm in (block.forward_ssm, block.backward_ssm)]
    y_ref, grads_ref = output_and_grads(separate)
    y, grads = output_and_grads(None)
    assert calls == [4]  # both directions' two stages in one generation
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


def test_encoder_kernels_generated_together_equal_kernels_generated_one_by_one(monkeypatch):
    from dataclasses import replace

    from ssm_fairseq.ssm import batched_kernels

    torch.manual_seed(0)
    encoder = SpeechEncoder("mssm", 3, replace(SMALL, dropout=0.0), input_dim=20, subsampler="ms").double().train()
    features = torch.randn(2, 40, 20, dtype=torch.float64)
    lengths = torch.tensor([40, 29])

    def output_and_grads():
        encoder.zero_grad()
        out = encoder(features, lengths)
        y = out["encoder_out"].masked_fill(out["padding_mask"].unsqueeze(-1), 0.0)
        y.square().sum().backward()
        return y.detach(), [p.grad.clone() for p in encoder.parameters()]

    calls = []
    monkeypatch.setattr(batched_kernels, "batched_kernels",
                        lambda kernels, L, inner=batched_kernels.batched_kernels: calls.append(len(kernels))
                        or inner(kernels, L))
    monkeypatch.setattr(batched_kernels, "GENERATION_BYTES", 0)  # every kernel alone
    y_ref, grads_ref = output_and_grads()
    assert set(calls) == {1}
    # the sub-sampler's scales (2 and 4 layers, width 8 at 40 frames and 16 at 20) and the encoder's 3 layers (width 32
    # at 10 frames), 4 kernels a layer (C = 2, float64): 5120 bytes a kernel at every scale
    for batched, budget, expected in [((), 3 * 5120, [3, 3, 2] + [3] * 5 + [1] + [3] * 4),  # at most 3 kernels a call
                                      ((), 10 ** 9, [2 * 4, 4 * 4, 3 * 4]),  # one generation per context
                                      (("cpu",), 0, [2 * 4, 4 * 4, 3 * 4])]:  # the GPU's path, here: unbounded
        monkeypatch.setattr(batched_kernels, "BATCHED_DEVICES", batched)
        monkeypatch.setattr(batched_kernels, "GENERATION_BYTES", budget)
        calls.clear()
        y, grads = output_and_grads()
        assert calls == expected, str((batched, budget, calls))
        assert not batched_kernels._GENERATED.get()  # released when the forward pass ends
        torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
        for g, g_ref in zip(grads, grads_ref):
            torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


def test_generation_groups_are_bounded_on_a_cpu_and_split_by_configuration(monkeypatch):
    from ssm_fairseq.ssm import MSSMKernel, S4Kernel, batched_kernels

    small, wide = MSSMKernel(8, 4, 2, heads=2), MSSMKernel(16, 4, 2, heads=2)
    kernels = [MSSMKernel(8, 4, 2, heads=2), small, wide, S4Kernel(8, 4, 2, l_max=16), MSSMKernel(8, 4, 2, heads=2)]
    monkeypatch.setattr(batched_kernels, "GENERATION_BYTES", 2 * 2 * 8 * 10 * 4)  # two width-8 kernels at L = 10
    groups = batched_kernels.generation_groups(kernels, 10)
    assert [[kernels.index(k) for k in g] for g in groups] == [[0, 1], [2], [3], [4]]
    monkeypatch.setattr(batched_kernels, "BATCHED_DEVICES", ("cpu",))
    groups = batched_kernels.generation_groups(kernels, 10)
    assert [[kernels.index(k) for k in g] for g in groups] == [[0, 1, 4], [2], [3]]


def test_bad_configurations_are_rejected():
    with pytest.raises(ValueError, match="even number of heads"):
        MultiHeadSSM(9, heads=3, gating="ihg")
    with pytest.raises(ValueError, match="multiple of heads"):
        MultiHeadSSM(10, heads=4)
    with pytest.raises(ValueError, match="single-head"):
        MultiHeadSSM(8, heads=2, kernel="s4", gating="glu")


def _encoder(layer_type, subsampler):
    return SpeechEncoder(layer_type, 2, SMALL, input_dim=20, subsampler=subsampler, conv_channels=4,
                         positions=layer_type == "transformer").eval()


@pytest.mark.parametrize("layer_type,subsampler", list(itertools.product(LAYER_TYPES, SUBSAMPLERS)))
def test_encoder_output_is_the_same_alone_and_padded_in_a_batch(layer_type, subsampler):
    encoder = _encoder(layer_type, subsampler)
    lengths = torch.tensor([41, 66, 23])
    features = torch.randn(3, 66, 20) * 5  # padded frames hold large random values, not zeros
    with torch.no_grad():
        batch = encoder(features, lengths)
        for i, n in enumerate(lengths.tolist()):
            alone = encoder(features[i : i + 1, :n], lengths[i : i + 1])
            m = int(alone["encoder_lengths"])
            assert batch["encoder_lengths"][i] == m and not batch["padding_mask"][i, :m].any()
            assert batch["padding_mask"][i, m:].all()
            assert torch.allclose(batch["encoder_out"][i, :m], alone["encoder_out"][0], atol=1e-4), (i, n)


@pytest.mark.parametrize("T", range(1, 16))
def test_conv_subsampler_lengths_match_its_convolutions(T):
    sub = ConvSubsampler(20, 8, channels=2)
    x, lengths, mask = sub(torch.randn(1, max(T, 7), 20), torch.tensor([T]))
    alone_frames = sub.convs(torch.randn(1, 1, T, 20)).shape[2] if T >= 7 else 0
    assert int(lengths) == alone_frames and mask.shape[1] == x.shape[1]


def test_time_reduction_stacks_frames_and_zero_fills_the_last_group():
    x = torch.arange(2 * 7 * 1.0).view(2, 7, 1) + 1
    y, lengths = time_reduction(x, torch.tensor([7, 5]), 3)
    assert lengths.tolist() == [3, 2] and y.shape == (2, 3, 3)
    assert y[0, 2].tolist() == [7.0, 0.0, 0.0]
    assert y[1, 1].tolist() == [11.0, 12.0, 0.0]


def test_multiscale_subsampler_reduces_by_four_with_ssm_layers_at_two_scales():
    encoder = _encoder("mssm", "ms")
    widths = [layers[0].blocks[0].norm.normalized_shape[0] for layers in encoder.subsampler.scales]
    assert widths == [8, 16] and [len(s) for s in encoder.subsampler.scales] == [2, 4]
    out = encoder(torch.randn(1, 33, 20), torch.tensor([33]))
    assert out["encoder_out"].shape == (1, 9, 32)


def test_zero_ssm_heads_is_refused_by_name():
    """--ssm-heads 0 divided by zero in the layer's shape check."""
    with pytest.raises(ValueError, match=r"the number of SSM heads \(--ssm-heads\) must be at least 1, got 0"):
        MultiHeadSSM(16, heads=0)
    with pytest.raises(ValueError, match="heads must be at least 1, got 0"):
        MSSMKernel(16, 4, heads=0)


def test_chunk_by_chunk_from_a_batch_of_chunked_min_positions():
    """On a CPU the choice counts a batch's positions (sequences x padded length), in training and in inference: a
    fairseq batch of short utterances is convolved chunk by chunk, one short utterance by FFT."""
    from ssm_fairseq.ssm import batched_kernels
    from ssm_fairseq.ssm.batched_kernels import ChunkedKernel

    kernels = [MSSMKernel(8, 4, heads=2)]
    positions = batched_kernels.CHUNKED_MIN_POSITIONS
    for L, batch, chunked in ((positions - 1, 1, False), (positions, 1, True), (positions // 8, 8, True),
                              (positions // 8, 7, False)):
        (kernel,) = batched_kernels.layer_kernels(kernels, L, batch)
        assert isinstance(kernel, ChunkedKernel) == chunked, (L, batch)
        with torch.no_grad():
            (kernel,) = batched_kernels.layer_kernels(kernels, L, batch)
        assert isinstance(kernel, ChunkedKernel) == chunked, (L, batch)


def test_block_convolved_chunk_by_chunk_equals_the_fft_convolution_of_its_kernels(monkeypatch):
    """On CPU long sequences' MSSM kernels are convolved from their diagonal systems (ssm/chunked_conv.py), each stage
    recomputed in the backward pass: outputs and gradients equal the generated kernels' FFT convolutions, padding
    included (here from the shortest length)."""
    from ssm_fairseq.layers import recompute
    from ssm_fairseq.layers.state_space import multihead_ssm
    from ssm_fairseq.ssm import batched_kernels
    from ssm_fairseq.ssm.batched_kernels import ChunkedKernel

    monkeypatch.setattr(batched_kernels, "CHUNKED_MIN_POSITIONS", 1)
    monkeypatch.setattr(multihead_ssm, "RECOMPUTE_MIN_LENGTH", 1)

    torch.manual_seed(0)
    block = BidirectionalSSM(8, heads=2, stack=2, gating="ihg", state_size=4, dropout=0.2).double().train()
    x = torch.randn(2, 37, 8, dtype=torch.float64, requires_grad=True)
    padding_mask = torch.zeros(2, 37, dtype=torch.bool)
    padding_mask[1, 20:] = True

    def output_and_grads():
        torch.manual_seed(1)  # the same dropout masks on both paths
        y = block(x, padding_mask)
        return [y, *torch.autograd.grad(y.square().sum(), [x, *block.parameters()])]

    assert all(isinstance(k, ChunkedKernel) for k in batched_kernels.layer_kernels(list(block.forward_ssm.kernels), 37))
    checkpointed = []
    monkeypatch.setattr(recompute, "checkpoint", lambda fn, *args, use_reentrant, inner=recompute.checkpoint:
                        checkpointed.append(fn) or inner(fn, *args, use_reentrant=use_reentrant))
    chunked = output_and_grads()
    assert len(checkpointed) == 4  # two stages of each direction
    monkeypatch.setattr(batched_kernels, "CHUNKED_DEVICES", ())
    monkeypatch.setattr(recompute, "checkpoint", lambda fn, *args, use_reentrant: fn(*args))
    for a, b in zip(chunked, output_and_grads()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def _with_padding(module, x, padding_mask, grad: bool):
    """``module(x, padding_mask)`` at the real frames, and with ``grad`` the gradients of their squares' sum."""
    if not grad:
        with torch.no_grad():
            return [module(x, padding_mask)[~padding_mask]]
    y = module(x, padding_mask)[~padding_mask]
    return [y, *torch.autograd.grad(y.square().sum(), [x, *module.parameters()])]


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("module", ["bidirectional", "bidirectional one head", "causal with output Linear",
                                    "causal one head glu", "causal gelu"])
def test_stacks_convolved_chunk_by_chunk_equal_the_fft_convolution(module, training, monkeypatch):
    """A block and stacks convolved chunk by chunk equal their FFT path at every real frame: in inference channels first
    (projection, stages, Linears, output Linear; each output written in place by its products, the chunk matrices
    kept), in training batch first (gradients included, stages not recomputed)."""
    from ssm_fairseq.ssm import batched_kernels

    torch.manual_seed(0)
    builds = {
        "bidirectional": lambda: BidirectionalSSM(8, heads=2, stack=2, gating="ihg", state_size=4),
        "bidirectional one head": lambda: BidirectionalSSM(8, heads=1, stack=2, gating="glu", state_size=4),
        "causal with output Linear": lambda: MultiHeadSSM(8, heads=2, stack=3, gating="ihg", state_size=4),
        "causal one head glu": lambda: MultiHeadSSM(8, heads=1, stack=2, gating="glu", state_size=4),
        "causal gelu": lambda: MultiHeadSSM(8, heads=4, stack=1, gating="gelu", state_size=4),
    }
    block = builds[module]().double().train(training)
    x = torch.randn(3, 29, 8, dtype=torch.float64, requires_grad=training)
    padding_mask = torch.zeros(3, 29, dtype=torch.bool)
    padding_mask[1, 20:] = padding_mask[2, 5:] = True
    x.data[padding_mask] = 1e3  # garbage in the padding must not reach real frames
    monkeypatch.setattr(batched_kernels, "CHUNKED_MIN_POSITIONS", 1)
    chunked = _with_padding(block, x, padding_mask, training)
    if not training:  # the kept chunk matrices give the same outputs again
        torch.testing.assert_close(_with_padding(block, x, padding_mask, False)[0], chunked[0], rtol=0, atol=0)
    monkeypatch.setattr(batched_kernels, "CHUNKED_DEVICES", ())
    for a, b in zip(chunked, _with_padding(block, x, padding_mask, training)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("gating, heads", [("ihg", 2), ("glu", 1), ("gelu", 2)])
def test_inference_convolved_chunk_by_chunk_allocates_no_more_than_one_directions_activations(gating, heads,
                                                                                             monkeypatch):
    """In inference a block convolved chunk by chunk allocates no tensor larger than one direction's ``D x B x L'``
    activations (``L'``: whole chunks; here the chunk is longer than the state size): each stage's ``C`` output rows
    are activated one at a time (not ``C x D x B x L'`` at once) and each direction is projected just before its stages
    (not ``2D x B x L'`` at once), with and without padding. Large tensors are what glibc maps afresh at every call, so
    that they are faulted in page by page (docs/benchmarks.md). Each stage's dropout is still applied."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from ssm_fairseq.ssm import batched_kernels

    class LargestAllocation(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view:
                for t in out if isinstance(out, (tuple, list)) else [out]:
                    if isinstance(t, torch.Tensor):
                        self.largest = max(self.largest, t.untyped_storage().nbytes())
            return out

    torch.manual_seed(0)
    D, B, chunk, stages = 16, 3, 8, 2
    block = BidirectionalSSM(D, heads=heads, stack=stages, gating=gating, state_size=4).eval()
    dropouts = []
    for ssm in (block.forward_ssm, block.backward_ssm):
        ssm.dropout.register_forward_hook(lambda module, args, out: dropouts.append(module))
    for L in (40, 37):  # 37: padded to 40, the last frames of two sequences masked
        padding_mask = torch.zeros(B, L, dtype=torch.bool)
        if L % chunk:
            padding_mask[1, 30:] = padding_mask[2, 11:] = True
        monkeypatch.setattr(batched_kernels, "CHUNKED_DEVICES", ("cpu",))
        monkeypatch.setattr(batched_kernels, "CHUNKED_MIN_POSITIONS", 1)
        monkeypatch.setattr(batched_kernels, "default_chunk", lambda length, batch=1: chunk)
        x = torch.randn(B, L, D)
        with torch.no_grad():
            block(x, padding_mask)  # the chunk matrices kept
            dropouts.clear()
            with LargestAllocation() as mode:
                y = block(x, padding_mask)
        assert mode.largest == D * B * 40 * 4, (L, mode.largest)  # one direction's activations, in float32
        assert len(dropouts) == 2 * stages
        monkeypatch.setattr(batched_kernels, "CHUNKED_DEVICES", ())
        with torch.no_grad():
            torch.testing.assert_close(y[~padding_mask], block(x, padding_mask)[~padding_mask], rtol=1e-4, atol=1e-5)


def test_inference_convolved_chunk_by_chunk_keeps_a_half_precision_models_dtype(monkeypatch):
    """A half-precision block convolved chunk by chunk in inference returns half precision, as its FFT path does (the
    convolutions compute in float32; the Linears between stages take the stage's output in the weights' dtype)."""
    from ssm_fairseq.ssm import batched_kernels

    torch.manual_seed(0)
    block = BidirectionalSSM(16, heads=2, stack=2, gating="ihg", state_size=4).eval()
    x = torch.randn(3, 40, 16)
    with torch.no_grad():
        expected = block(x)
        block.half()
        monkeypatch.setattr(batched_kernels, "CHUNKED_MIN_POSITIONS", 1)
        y = block(x.half())
    assert y.dtype == torch.float16
    torch.testing.assert_close(y.float(), expected, rtol=0, atol=0.03)


def test_kept_chunk_matrices_follow_the_parameters():
    """In inference a kernel's chunk matrices are computed once and reused, and computed again after a parameter
    changes (an optimiser step) or for another chunk length."""
    kernel = MSSMKernel(8, 4, out_channels=2, heads=2).double().eval()
    with torch.no_grad():
        first = kernel.chunk_matrices(32, 8, False, torch.float64)
        assert kernel.chunk_matrices(32, 8, False, torch.float64) is first
        assert kernel.chunk_matrices(32, 4, False, torch.float64) is not first
        kernel.z_dt.add_(0.1)
        again = kernel.chunk_matrices(32, 8, False, torch.float64)
    assert again is not first and not torch.equal(again.decay, first.decay)
