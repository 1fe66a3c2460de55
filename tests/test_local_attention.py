"""LocalAttention (SPADE window / chunk attention) against a dense masked reference."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from ssm_fairseq.layers.attention.local_attention import LocalAttention
from ssm_fairseq.layers.attention.relative_position import RelativePositionBias

MODES_CAUSAL = list(itertools.product(["window", "chunk"], [False, True]))


def dense_reference(att: LocalAttention, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """Full softmax attention with an explicit ``L x L`` mask, using ``att``'s projection weights."""
    B, L, D = x.shape
    H, w = att.heads, att.window
    q, k, v = F.linear(x, att.qkv.weight, att.qkv.bias).view(B, L, 3, H, D // H).permute(2, 0, 3, 1, 4)
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    allowed = (i - j).abs() <= w if att.mode == "window" else (i // w) == (j // w)
    if att.causal:
        allowed = allowed & (j <= i)
    allowed = allowed.expand(B, 1, L, L)
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D // H)
    y = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
    return F.linear(y.transpose(1, 2).reshape(B, L, D), att.out_proj.weight, att.out_proj.bias)


def make(mode: str, causal: bool, window: int = 4, dim: int = 8, heads: int = 2) -> LocalAttention:
    return LocalAttention(dim, heads, window, mode=mode, causal=causal).double().eval()


@pytest.mark.parametrize("mode,causal", MODES_CAUSAL)
@pytest.mark.parametrize("L", [8, 11, 3])
def test_matches_dense_reference_with_padding(mode, causal, L):
    att = make(mode, causal)
    x = torch.randn(3, L, 8, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([L, max(L - 2, 1), 1])
    pad = torch.arange(L)[None, :] >= lengths[:, None]
    y = att(x, key_padding_mask=pad)
    ref = dense_reference(att, x, pad)
    real = ~pad
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y[real], ref[real], atol=1e-8, rtol=0)
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("mode,causal", MODES_CAUSAL)
@pytest.mark.parametrize("L,window", [(8, 4), (11, 4), (3, 4), (7, 1), (5, 5)])
def test_matches_dense_reference_without_padding(mode, causal, L, window):
    att = make(mode, causal, window=window)
    x = torch.randn(2, L, 8, dtype=torch.float64)
    torch.testing.assert_close(att(x), dense_reference(att, x, None), atol=1e-8, rtol=0)


def run_pieces(att: LocalAttention, x: Tensor, pieces: list[int], cache: dict | None = None, offset: int = 0) -> Tensor:
    """Feed ``x`` through ``cache`` (which has seen ``offset`` tokens) in consecutive pieces; check the cache size
    after each one."""
    cache = {} if cache is None else cache
    outs, start = [], 0
    for n in pieces:
        outs.append(att(x[:, start : start + n], cache=cache))
        start += n
        k, v = att.keys_and_values(cache)
        assert k.shape[2] <= att.window and v.shape == k.shape
        assert k.shape[2] == ((offset + start) % att.window if att.mode == "chunk" else min(offset + start, att.window))
    return torch.cat(outs, 1)


@pytest.mark.parametrize("mode", ["window", "chunk"])
@pytest.mark.parametrize("pieces", [[1] * 13, [1, 3, 2, 5, 2], [13], [4, 4, 5]])
def test_incremental_equals_full_causal(mode, pieces):
    att = make(mode, causal=True)
    x = torch.randn(2, 13, 8, dtype=torch.float64)
    torch.testing.assert_close(run_pieces(att, x, pieces), att(x), atol=1e-10, rtol=0)


@pytest.mark.parametrize("mode", ["window", "chunk"])
@pytest.mark.parametrize("new_order", [[2, 0, 1], [1, 1, 2]])
def test_reorder_cache(mode, new_order):
    att = make(mode, causal=True)
    x = torch.randn(3, 11, 8, dtype=torch.float64)
    order = torch.tensor(new_order)
    cache: dict = {}
    run_pieces(att, x[:, :6], [1, 2, 3], cache)
    LocalAttention.reorder_cache(cache, order)
    rest = run_pieces(att, x[order, 6:], [1, 4], cache, offset=6)
    torch.testing.assert_close(rest, att(x[order])[:, 6:], atol=1e-10, rtol=0)


class LargestTensor(TorchFunctionMode):
    """Record the element count of the largest tensor any torch function returns."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


@pytest.mark.parametrize("mode,causal", MODES_CAUSAL)
def test_never_builds_l_by_l(mode, causal):
    L, w, heads = 4096, 16, 2
    att = LocalAttention(8, heads, w, mode=mode, causal=causal).eval()
    x = torch.randn(1, L, 8)
    pad = torch.zeros(1, L, dtype=torch.bool)
    with torch.no_grad(), LargestTensor() as probe:
        y = att(x, key_padding_mask=pad)
    assert y.shape == x.shape
    assert probe.numel <= heads * L * 3 * w < L * L // 16


@pytest.mark.parametrize("mode,causal", MODES_CAUSAL)
def test_a_sequence_within_the_window_scores_only_its_own_keys(mode, causal):
    """Shorter than the window (a fine-tuning sentence under a 128-token window), every key is within reach: the
    scores and masks are ``L x L``, not a window of queries over three windows of keys (4.9x as many at 100 / 128)."""
    L, w, heads, batch = 100, 128, 2, 3
    att = LocalAttention(8, heads, w, mode=mode, causal=causal).eval()
    x = torch.randn(batch, L, 8)
    pad = torch.arange(L)[None, :] >= torch.tensor([L, 60, 1])[:, None]
    with torch.no_grad(), LargestTensor() as probe:
        y = att(x, key_padding_mask=pad)
    assert y.shape == x.shape
    assert probe.numel <= batch * heads * L * L


def test_dropout_only_in_training():
    att = LocalAttention(8, 2, 4, dropout=0.5).double()
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    train = att(x)
    att.eval()
    assert not torch.allclose(train, att(x))
    torch.testing.assert_close(att(x), dense_reference(att, x, None), atol=1e-8, rtol=0)


def test_errors():
    with pytest.raises(ValueError, match="window"):
        LocalAttention(8, 2, 0)
    with pytest.raises(ValueError, match="multiple"):
        LocalAttention(9, 2, 4)
    with pytest.raises(ValueError, match="mode"):
        LocalAttention(8, 2, 4, mode="strided")
    x = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="causal"):
        LocalAttention(8, 2, 4)(x, cache={})
    with pytest.raises(ValueError, match="key_padding_mask"):
        LocalAttention(8, 2, 4, causal=True)(x, key_padding_mask=torch.zeros(1, 3, dtype=torch.bool), cache={})


@pytest.mark.parametrize("mode", ["window", "chunk"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_queries_without_keys_stay_finite_with_a_position_bias(mode, dtype):
    """Padding that leaves whole blocks without a real key, a T5 bias, low precision: outputs and gradients finite."""
    att = LocalAttention(8, 2, 4, mode=mode).to(dtype)
    bias = RelativePositionBias(2, bidirectional=True).to(dtype)
    x = torch.randn(2, 20, 8, dtype=dtype, requires_grad=True)
    pad = torch.arange(20)[None, :] >= torch.tensor([20, 3])[:, None]
    y = att(x, key_padding_mask=pad, position_bias=bias)
    y.float().square().sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in [*att.parameters(), *bias.parameters()])


@pytest.mark.parametrize("mode", ["window", "chunk"])
def test_incremental_with_a_position_bias_equals_full_beyond_the_window(mode):
    """Three tokens, then token by token past the window (in window mode each token's bias is a slice of the
    sequence's row of biases by distance, in chunk mode the mask with the bias is reused from the cache) and after a
    beam reordering, the outputs equal the full forward's."""
    att = make(mode, causal=True)
    bias = RelativePositionBias(2, bidirectional=False).double()
    x = torch.randn(3, 15, 8, dtype=torch.float64)
    order = torch.tensor([2, 0, 1])
    cache: dict = {}
    with torch.no_grad():
        first = torch.cat([att(x[:, :3], cache=cache, position_bias=bias),
                           *[att(x[:, i : i + 1], cache=cache, position_bias=bias) for i in range(3, 10)]], 1)
        LocalAttention.reorder_cache(cache, order)
        rest = torch.cat([att(x[order, i : i + 1], cache=cache, position_bias=bias) for i in range(10, 15)], 1)
        torch.testing.assert_close(first, att(x, position_bias=bias)[:, :10], atol=1e-10, rtol=0)
        torch.testing.assert_close(rest, att(x[order], position_bias=bias)[:, 10:], atol=1e-10, rtol=0)


@pytest.mark.parametrize("mode", ["window", "chunk"])
@pytest.mark.parametrize("biased", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_rows_of_different_lengths_step_together_as_each_alone(mode, biased, grad):
    """Caches of rows that have seen 2, 9, 5 and 5 tokens (window 4: some windows not full, chunks at different
    phases), concatenated, stepped by 1, 2 and 6 new tokens a row (more than a window), reordered (a row dropped,
    one repeated) and stepped again: each row's outputs equal its own full forward pass."""
    torch.manual_seed(3)
    att = make(mode, causal=True)
    bias = RelativePositionBias(2, bidirectional=False).double() if biased else None
    x = torch.randn(4, 24, 8, dtype=torch.float64)
    seen = [2, 9, 5, 5]
    with torch.set_grad_enabled(grad):
        full = [att(x[b : b + 1], position_bias=bias) for b in range(4)]
        caches = [{}, {}, {}]  # rows 2 and 3 share one cache, as rows of one batch
        for cache, rows in zip(caches, ([0], [1], [2, 3])):
            att(x[rows, : seen[rows[0]]], cache=cache, position_bias=bias)
        cache = att.concatenate_caches(caches)
        assert cache["missing"].tolist() == ([2, 0, 0, 0] if mode == "window" else [0, 1, 1, 1])
        rows = [0, 1, 2, 3]  # the sequence of each row of the cache
        for n in (1, 2, 6):
            y = att(torch.cat([x[b : b + 1, seen[b] : seen[b] + n] for b in rows]), cache=cache, position_bias=bias)
            for i, b in enumerate(rows):
                torch.testing.assert_close(y[i : i + 1], full[b][:, seen[b] : seen[b] + n], atol=1e-10, rtol=0)
            seen = [s + n if b in rows else s for b, s in enumerate(seen)]
            if n == 2:
                LocalAttention.reorder_cache(cache, torch.tensor([2, 0, 0]))
                rows = [rows[2], rows[0], rows[0]]


def test_concatenating_a_cache_that_has_seen_nothing_is_refused():
    att = make("window", causal=True)
    cache: dict = {}
    att(torch.randn(1, 3, 8, dtype=torch.float64), cache=cache)
    with pytest.raises(ValueError, match="seen no token"):
        att.concatenate_caches([cache, {}])
