"""What training on a CPU keeps for the backward pass: one-byte dropout masks, and the local attention's blocks and
SPADE's SSM branch recomputed (activation checkpointing), each with the gradients of the plain autograd path."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from ssm_fairseq.layers import recompute
from ssm_fairseq.layers.dropout import LeanDropout
from ssm_fairseq.layers.attention.local_attention import LocalAttention
from ssm_fairseq.layers.spade_layer import SpadeLayer


def kept_for_backward(run) -> list[torch.Tensor]:
    """The distinct storages (as tensors) that autograd keeps while ``run()`` builds its graph."""
    kept = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.setdefault(t.untyped_storage().data_ptr(), t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return list(kept.values())


def activation_bytes(kept: list[torch.Tensor], module: nn.Module) -> int:
    """Bytes of the kept storages that are not ``module``'s parameters."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    return sum(t.untyped_storage().nbytes() for t in kept if t.untyped_storage().data_ptr() not in params)


def gradients(module: nn.Module, x: torch.Tensor, seed: int, **kwargs) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    y = module(x, **kwargs)
    return torch.autograd.grad((y * torch.randn_like(y)).sum(), [x, *module.parameters()])


def without_checkpointing(monkeypatch) -> None:
    """Make ``recompute``'s ``checkpoint`` call its function directly: the plain autograd path."""
    monkeypatch.setattr(recompute, "checkpoint", lambda fn, *args, use_reentrant: fn(*args))


def test_lean_dropout_is_dropout_with_a_one_byte_mask():
    torch.manual_seed(0)
    dropout = LeanDropout(0.3).train()
    x = torch.rand(64, 50, dtype=torch.float64) + 0.5  # no zeros: the output's zeros are the dropped units
    x.requires_grad_(True)
    kept = kept_for_backward(lambda: dropout(x).backward(torch.full_like(x, 2.0)))
    assert [t.dtype for t in kept] == [torch.bool]
    y = dropout(x)
    keep = y != 0
    torch.testing.assert_close(y, x * keep / 0.7, atol=1e-12, rtol=0)
    x.grad = None
    y.backward(torch.full_like(x, 2.0))
    torch.testing.assert_close(x.grad, 2.0 * keep.double() / 0.7, atol=1e-12, rtol=0)
    assert 0.6 < keep.double().mean() < 0.8
    dropout.eval()
    assert torch.equal(dropout(x), x)


def test_local_attention_keeps_only_its_projections_and_recomputes_the_same_gradients(monkeypatch):
    """Training keeps the ``q, k, v`` projection (and the input it reads), not the blocks of keys copied into
    several spans; attention dropout is drawn again identically in the recomputation."""
    L, D = 64, 8
    att = LocalAttention(D, 2, 8, mode="window", causal=True, dropout=0.3).double().train()
    x = torch.randn(2, L, D, dtype=torch.float64, requires_grad=True)
    kept = kept_for_backward(lambda: att(x))
    assert activation_bytes(kept, att) == x.numel() * 8 * (1 + 3 + 1)  # input, q k v, attention output
    checkpointed = gradients(att, x, seed=1)
    without_checkpointing(monkeypatch)
    for got, want in zip(checkpointed, gradients(att, x, seed=1)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("ssm", ["s4", "mssm"])
def test_spade_global_layer_keeps_nothing_of_its_ssm_branch_and_recomputes_the_same_gradients(monkeypatch, causal,
                                                                                             ssm):
    """The SSM branch ``LN(SSM(h))`` of a global layer keeps nothing for the backward pass (not the kernel
    generation's or the FFT convolution's intermediates): it runs again there, with the same gradients."""
    torch.manual_seed(0)
    layer = SpadeLayer(8, 16, 2, 4, causal=causal, ssm=ssm, ssm_state_size=4, l_max=32, ssm_heads=2,
                       dropout=0.2).double().train()
    x = torch.randn(2, 32, 8, dtype=torch.float64, requires_grad=True)
    pad = torch.zeros(2, 32, dtype=torch.bool)
    pad[1, 20:] = True
    inside, saved_inside = [], []  # modules of the branch being run; what was kept meanwhile
    for module in [*layer.ssm.modules(), layer.ssm_out_norm]:
        module.register_forward_pre_hook(lambda *_: inside.append(1))
        module.register_forward_hook(lambda *_: (inside.pop(), None)[1])

    def pack(t: torch.Tensor) -> torch.Tensor:
        if inside:
            saved_inside.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, pad)
    assert saved_inside == []
    checkpointed = gradients(layer, x, seed=1, padding_mask=pad)
    without_checkpointing(monkeypatch)
    for got, want in zip(checkpointed, gradients(layer, x, seed=1, padding_mask=pad)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("chunked", [True, False])
def test_mssm_stages_keep_only_their_inputs(monkeypatch, chunked):
    """Each stage of the MSSM block (convolution, gating, dropout) of a long sequence is recomputed on a CPU (here from
    the shortest length), whichever way it is convolved: what autograd keeps is the stage inputs and the linears'
    inputs, all ``B x L x D``, nothing ``B x C x D x L``."""
    from ssm_fairseq.layers.state_space import multihead_ssm
    from ssm_fairseq.layers.state_space.bidirectional_ssm import BidirectionalSSM
    from ssm_fairseq.ssm import batched_kernels

    monkeypatch.setattr(multihead_ssm, "RECOMPUTE_MIN_LENGTH", 1)
    monkeypatch.setattr(batched_kernels, "CHUNKED_MIN_POSITIONS", 1 if chunked else 10 ** 9)

    torch.manual_seed(0)
    block = BidirectionalSSM(16, heads=2, stack=2, gating="ihg", state_size=4, dropout=0.1).train()
    x = torch.randn(2, 50, 16, requires_grad=True)
    kept = kept_for_backward(lambda: block(x))
    large = [t for t in kept if t.numel() >= x.numel()]  # the rest: the kernels' H x N systems
    # x; per direction: two stage inputs and the stage-1 output (its linear's input); the 2D concatenation (two)
    assert sum(t.numel() for t in large) == (1 + 2 * 3 + 2) * x.numel()
