"""The position-wise feed-forward block of transformer-style layers.

In training the block keeps, for its backward pass, only its input and the first linear's output ``h``; the
activation and the dropped activations are recomputed from ``h``, one elementwise activation more in the backward
pass. The dropout mask is kept inside ``h``: a dropped unit's ``h`` is overwritten with ``DROPPED``, where every
activation of ``ACTIVATIONS`` and its derivative are exactly 0 (in float16 to float64; tested), so recomputing from
``h`` gives the dropped activations and their gradient directly. Plain autograd would also keep the activations that
the second linear reads and dropout's mask (on a CPU as floats).

In evaluation on a CPU, a batch of more than ``BLOCK_ELEMENTS`` hidden activations runs block by block: each block of
positions through both linears and the activation in one reused buffer (``_blocked_evaluation``), so that the hidden
activations never exist whole. At a recipe's batch (``fairseq-generate --max-tokens 40000``: 9,750 positions of
width 512, hidden 2,048) the whole hidden tensor is 80 MB, written by the first product, read and written by the
activation and read by the second product, each pass from memory and each new tensor faulted in page by page; block by
block it stays in cache (``scripts/benchmarks/encoder_parts.py``, docs/benchmarks.md). Each position's output is the
plain block's within rounding (the same products, row by row; a product of fewer rows may round differently).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "swish": nn.SiLU}
DROPPED = -1e4  # a dropped unit's kept pre-activation: every activation above and its derivative are 0 there
# in evaluation on a CPU, hidden activations per block of positions (8 MiB of float32: 4096 positions of a 512-wide
# hidden layer, 1024 of a 2048-wide one), where a batch has more
BLOCK_ELEMENTS = 1 << 21


def build_activation(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]()


def _activation_backward(activation: nn.Module, grad: Tensor, h: Tensor) -> Tensor:
    """The gradient through ``activation`` at its input ``h``, from the activation's gradient ``grad``, without the
    activation's output (which a backward pass through autograd would need alive)."""
    if isinstance(activation, nn.GELU):
        return torch.ops.aten.gelu_backward(grad, h, approximate=activation.approximate)
    if isinstance(activation, nn.SiLU):
        return torch.ops.aten.silu_backward(grad, h)
    if isinstance(activation, nn.ReLU):
        return torch.ops.aten.threshold_backward(grad, h, 0)
    raise TypeError(f"no backward rule for the activation {activation}")


def _activate_in_place(activation: nn.Module, h: Tensor) -> Tensor:
    """``activation(h)`` written into ``h``."""
    if isinstance(activation, nn.GELU):
        return torch.ops.aten.gelu_(h, approximate=activation.approximate)
    if isinstance(activation, nn.SiLU):
        return F.silu(h, inplace=True)
    if isinstance(activation, nn.ReLU):
        return h.relu_()
    raise TypeError(f"no in-place form of the activation {activation}")


def _blocked_evaluation(x: Tensor, first: nn.Linear, activation: nn.Module, second: nn.Linear) -> Tensor:
    """``second(activation(first(x)))`` (``... x D``, no autograd) in blocks of ``BLOCK_ELEMENTS // hidden`` positions,
    the hidden activations of each block in one reused buffer and each block's output written in place."""
    rows = x.reshape(-1, x.shape[-1])
    out = rows.new_empty(rows.shape[0], second.out_features)
    block = max(1, BLOCK_ELEMENTS // first.out_features)
    hidden = rows.new_empty(min(block, rows.shape[0]), first.out_features)
    for start in range(0, rows.shape[0], block):
        piece = rows[start:start + block]
        h = torch.addmm(first.bias, piece, first.weight.t(), out=hidden[:piece.shape[0]])
        torch.addmm(second.bias, _activate_in_place(activation, h), second.weight.t(), out=out[start:start + block])
    return out.view(*x.shape[:-1], second.out_features)


def _blocks_pay(x: Tensor, first: nn.Linear, second: nn.Linear) -> bool:
    """Whether evaluation runs block by block: not while tracing, exporting or compiling (which would unroll the
    blocks of one shape); on a CPU, in float32 or float64 (the weights' dtype) without autocast, both linears with
    biases, and more hidden activations than one block holds."""
    if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling():
        return False
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or torch.is_autocast_enabled("cpu"):
        return False
    if first.weight.dtype != x.dtype or second.weight.dtype != x.dtype or first.bias is None or second.bias is None:
        return False
    return math.prod(x.shape[:-1]) * first.out_features > BLOCK_ELEMENTS


class _LeanFeedForward(torch.autograd.Function):
    """``Linear(w2, b2)(Dropout_p(activation(Linear(w1, b1)(x))))`` saving ``x`` and ``h`` (``DROPPED`` where the
    dropout mask drops a unit).

    The backward pass recomputes the dropped activations for ``w2``'s gradient and frees them before the
    activation's gradient, so that it never holds more than plain autograd's backward pass does. Under autocast
    the products run in the autocast dtype, as ``F.linear`` would: the backward pass computes in ``h``'s dtype and
    returns each gradient in its input's dtype.
    """

    @staticmethod
    def forward(ctx, x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, activation: nn.Module,
                p: float) -> Tensor:
        h = F.linear(x, w1, b1)
        a = activation(h)
        if p > 0:
            a, keep = torch.native_dropout(a, p, True)  # a boolean mask, the kept units scaled by 1 / (1 - p)
            h.masked_fill_(~keep.bool(), DROPPED)  # (an empty input's mask is float)
        ctx.activation, ctx.p = activation, p
        ctx.save_for_backward(x, h, w1, w2)
        return F.linear(a, w2, b2)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        x, h, w1, w2 = ctx.saved_tensors
        dtype = h.dtype
        grad = grad.to(dtype).flatten(0, -2)  # rows x D
        scale = 1 / (1 - ctx.p) if ctx.p < 1 else 0.0  # the forward pass's (native_dropout's) scale
        dropped = ctx.activation(h).mul_(scale)  # 0 at the dropped units
        grad_w2 = grad.t() @ dropped.flatten(0, -2)
        del dropped
        grad_a = (grad @ w2.to(dtype)).view_as(h).mul_(scale)
        grad_h = _activation_backward(ctx.activation, grad_a, h).flatten(0, -2)  # 0 at the dropped units
        del grad_a
        grad_x = (grad_h @ w1.to(dtype)).view(x.shape).to(x.dtype)
        grad_w1 = grad_h.t() @ x.to(dtype).flatten(0, -2)
        return (grad_x, grad_w1.to(w1.dtype), grad_h.sum(0).to(w1.dtype), grad_w2.to(w2.dtype),
                grad.sum(0).to(w2.dtype), None, None)


class FeedForward(nn.Module):
    """``Linear(D, hidden) -> act -> dropout -> Linear(hidden, D)``: ``B x L x D -> B x L x D``."""

    def __init__(self, dim: int, hidden_dim: int, activation: str = "gelu", dropout: float = 0.0):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden_dim), build_activation(activation), nn.Dropout(dropout), nn.Linear(hidden_dim, dim)
        )

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        first, activation, dropout, second = self.net
        if not self.training:  # evaluation, e.g. a generated token: the block without its modules' calls
            if not torch.is_grad_enabled() and _blocks_pay(x, first, second):
                return _blocked_evaluation(x, first, activation, second)
            return F.linear(activation(F.linear(x, first.weight, first.bias)), second.weight, second.bias)
        if not torch.is_grad_enabled():
            return self.net(x)
        p = dropout.p
        return _LeanFeedForward.apply(x, first.weight, first.bias, second.weight, second.bias, activation, p)

    def step(self, x: Tensor, cache: dict) -> Tensor:
        """The next frames of a stream (``B x n x D``): position-wise, so no state."""
        return self.net(x)
