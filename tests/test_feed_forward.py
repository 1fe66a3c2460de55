"""The feed-forward block's lean backward pass: the gradients of plain autograd, with less kept for it; and its
evaluation block by block on a CPU: the plain block's outputs."""
from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F

from ssm_fairseq.layers import feed_forward
from ssm_fairseq.layers.feed_forward import ACTIVATIONS, DROPPED, FeedForward, _activation_backward


def plain_autograd(ffn: FeedForward, x: torch.Tensor, keep: torch.Tensor | None, p: float) -> torch.Tensor:
    """The same block by plain autograd ops, with a given dropout mask."""
    first, activation, _, second = ffn.net
    a = activation(first(x))
    return second(a if keep is None else a * keep / (1 - p))


def gradients(ffn: FeedForward, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    weights = torch.randn_like(y)
    return torch.autograd.grad((y * weights).sum(), [x, *ffn.parameters()])


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_gradients_equal_plain_autograd(activation, p):
    torch.manual_seed(0)
    ffn = FeedForward(6, 24, activation, dropout=p).double().train()
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(1)
    y = ffn(x)
    torch.manual_seed(1)  # the block's first random draw is its dropout mask: draw it again
    keep = torch.empty(2, 5, 24, dtype=torch.bool).bernoulli_(1 - p) if p else None
    expected = plain_autograd(ffn, x, keep, p)
    torch.testing.assert_close(y, expected, atol=1e-12, rtol=0)
    torch.manual_seed(2)
    lean = gradients(ffn, x, y)
    torch.manual_seed(2)
    for got, want in zip(lean, gradients(ffn, x, expected)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_dropping_every_unit_gives_the_bias_and_zero_gradients():
    ffn = FeedForward(6, 24, "gelu", dropout=1.0).train()
    x = torch.randn(2, 5, 6, requires_grad=True)
    y = ffn(x)
    torch.testing.assert_close(y, ffn.net[-1].bias.expand_as(y), rtol=0, atol=0)
    y.square().sum().backward()
    assert x.grad.abs().max() == 0 and ffn.net[0].weight.grad.abs().max() == 0


def test_an_empty_batch_trains():
    ffn = FeedForward(6, 24, "gelu", dropout=0.3).train()
    x = torch.randn(0, 5, 6, requires_grad=True)
    y = ffn(x)
    y.sum().backward()
    assert y.shape == (0, 5, 6) and x.grad.shape == x.shape


def test_eval_and_no_grad_are_the_plain_block():
    ffn = FeedForward(6, 24, "gelu", dropout=0.5).eval()
    x = torch.randn(3, 6)
    with torch.no_grad():
        torch.testing.assert_close(ffn(x), ffn.net(x))
    torch.testing.assert_close(ffn(x), ffn.net(x))


def test_keeps_input_and_hidden_only():
    """Kept for the backward pass: the input and the hidden pre-activations, which carry the dropout mask (and the
    weights)."""
    ffn = FeedForward(8, 32, "gelu", dropout=0.1).train()
    x = torch.randn(4, 10, 8, requires_grad=True)
    kept = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        kept[t.untyped_storage().data_ptr()] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        ffn(x)
    weights = sum(p.numel() * 4 for p in ffn.parameters() if p.dim() == 2)
    activations = sum(t.untyped_storage().nbytes() for t in kept.values()) - weights
    assert activations == x.numel() * 4 + 40 * 32 * 4
    dtypes = sorted(str(t.dtype) for t in kept.values() if t.dim() == 3)
    assert dtypes == ["torch.float32", "torch.float32"]


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_a_dropped_unit_has_zero_activation_and_gradient(activation, dtype):
    """What lets the kept pre-activations carry the mask: at ``DROPPED`` the activation and its derivative are 0."""
    act = ACTIVATIONS[activation]()
    h = torch.full((4,), DROPPED, dtype=dtype)
    assert torch.equal(act(h), torch.zeros_like(h))
    assert torch.equal(_activation_backward(act, torch.full_like(h, 1e3), h), torch.zeros_like(h))


def test_bf16_autocast_matches_float32():
    torch.manual_seed(0)
    ffn = FeedForward(16, 64, "gelu").train()
    x = torch.randn(2, 7, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ffn(x)
    assert y.dtype == torch.bfloat16
    torch.manual_seed(3)
    low = gradients(ffn, x, y.float())
    torch.manual_seed(3)
    full = gradients(ffn, x, ffn(x))
    for got, want in zip(low, full):
        assert got.dtype == want.dtype == torch.float32
        assert (got - want).abs().max() <= 0.05 * want.abs().max()


_blocked = feed_forward._blocked_evaluation  # the function itself, which the tests below wrap or replace


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_evaluation_block_by_block_is_the_plain_block(monkeypatch, activation, dtype):
    """More hidden activations than a block holds: several blocks and a shorter last one, each position's output the
    plain block's within rounding (the same products row by row; a product of fewer rows may round differently)."""
    monkeypatch.setattr(feed_forward, "BLOCK_ELEMENTS", 7 * 24)  # 7 positions a block
    ffn = FeedForward(6, 24, activation, dropout=0.5).to(dtype).eval()
    x = torch.randn(3, 17, 6, dtype=dtype)  # 51 positions: 7 blocks of 7, then 2
    calls = []
    monkeypatch.setattr(feed_forward, "_blocked_evaluation",
                        lambda *args: calls.append(len(args)) or _blocked(*args))
    with torch.no_grad():
        got = ffn(x)
        assert calls, "the blocked path did not run"
        torch.testing.assert_close(got, ffn.net(x))
        assert got.shape == x.shape and got.is_contiguous()


def test_evaluation_runs_whole_where_blocks_do_not_pay(monkeypatch):
    """One block or less, autograd, autocast, tracing, the ONNX export, compiling, a linear without bias, or another
    dtype: the plain block."""
    import onnxruntime  # the deploy extra, which `make setup` installs: missing, the test fails rather than skips
    monkeypatch.setattr(feed_forward, "BLOCK_ELEMENTS", 7 * 24)
    ffn = FeedForward(6, 24, "gelu").eval()
    monkeypatch.setattr(feed_forward, "_blocked_evaluation", lambda *args: pytest.fail("ran block by block"))
    small, large = torch.randn(7, 6), torch.randn(3, 17, 6)
    with torch.no_grad():
        ffn(small)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ffn(large)
        traced = torch.jit.trace(ffn, (large,), check_trace=False)  # (the check calls it untraced, in blocks)
        other = torch.randn(2, 30, 6)
        torch.testing.assert_close(traced(other), ffn.net(other))  # the whole block traced, not 7 blocks of one shape
        ffn.half()(large.half())
        ffn.float()
        onnx = io.BytesIO()  # the ONNX export (TorchScript's tracer): the whole block, for any length
        torch.onnx.export(ffn, (large,), onnx, input_names=["x"], dynamic_axes={"x": {0: "batch", 1: "length"}},
                          dynamo=False)
    session = onnxruntime.InferenceSession(onnx.getvalue(), providers=["CPUExecutionProvider"])
    torch.testing.assert_close(torch.from_numpy(session.run(None, {"x": other.numpy()})[0]), ffn.net(other))
    with torch.no_grad():
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(ffn, backend="eager")(large), ffn.net(large))
    ffn.float()(large)  # autograd
    ffn.net[0].bias = None
    with torch.no_grad():
        torch.testing.assert_close(ffn(large), ffn.net(large))
