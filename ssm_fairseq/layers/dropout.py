"""Dropout that keeps a one-byte mask for the backward pass.

On a CPU, PyTorch's dropout multiplies its input by a float noise tensor and keeps that tensor for the backward
pass: four bytes per element, as much as the activation itself. ``LeanDropout`` keeps a boolean mask (one byte)
and rescales in the backward pass; its outputs and gradients are those of ``nn.Dropout`` with the same mask. On a
GPU PyTorch's fused dropout already keeps a one-byte mask and runs as one kernel, so it is used there as is.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


class _MaskedScale(torch.autograd.Function):
    """``x * keep / (1 - p)`` with a Bernoulli(``1 - p``) mask ``keep``, saving only the mask."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        keep = torch.empty_like(x, dtype=torch.bool).bernoulli_(1 - p)
        ctx.p = p
        ctx.save_for_backward(keep)
        return x * keep / (1 - p)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        (keep,) = ctx.saved_tensors
        return grad * keep / (1 - ctx.p), None


class LeanDropout(nn.Dropout):
    """``nn.Dropout`` (any shape, ``p`` the drop probability) whose backward pass keeps a one-byte mask on a CPU."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:  # what nn.Dropout returns, without its call
            return x
        lean = 0 < self.p < 1 and not self.inplace and x.device.type == "cpu"
        if lean and torch.is_grad_enabled() and x.requires_grad:
            return _MaskedScale.apply(x, self.p)
        return super().forward(x)
