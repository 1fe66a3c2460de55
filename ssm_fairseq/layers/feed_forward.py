"""The position-wise feed-forward block of transformer-style layers.

In training the block keeps, for its backward pass, only its input and the first linear's output ``h``; the
activation and the dropped activations are recomputed from ``h``, one elementwise activation more in the backward
pass. The dropout mask is kept inside ``h``: a dropped unit's ``h`` is overwritten with ``DROPPED``, where every
activation of ``ACTIVATIONS`` and its derivative are exactly 0 (in float16 to float64; tested), so recomputing from
``h`` gives the dropped activations and their gradient directly. Plain autograd would also keep the activations that
the second linear reads and dropout's mask (on a CPU as floats).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "swish": nn.SiLU}
DROPPED = -1e4  # a dropped unit's kept pre-activation: every activation above and its derivative are 0 there


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
            keep = torch.empty_like(h, dtype=torch.bool).bernoulli_(1 - p)
            a = a * keep / (1 - p)
            h.masked_fill_(~keep, DROPPED)
        ctx.activation, ctx.p = activation, p
        ctx.save_for_backward(x, h, w1, w2)
        return F.linear(a, w2, b2)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        x, h, w1, w2 = ctx.saved_tensors
        dtype = h.dtype
        grad = grad.to(dtype).flatten(0, -2)  # rows x D
        dropped = ctx.activation(h).div_(1 - ctx.p)  # 0 at the dropped units
        grad_w2 = grad.t() @ dropped.flatten(0, -2)
        del dropped
        grad_a = (grad @ w2.to(dtype)).view_as(h).div_(1 - ctx.p)
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
            return F.linear(activation(F.linear(x, first.weight, first.bias)), second.weight, second.bias)
        if not torch.is_grad_enabled():
            return self.net(x)
        p = dropout.p
        return _LeanFeedForward.apply(x, first.weight, first.bias, second.weight, second.bias, activation, p)

    def step(self, x: Tensor, cache: dict) -> Tensor:
        """The next frames of a stream (``B x n x D``): position-wise, so no state."""
        return self.net(x)
