"""Dropout that keeps a one-byte mask for the backward pass, in one operator each way.

On a CPU, PyTorch's dropout (``F.dropout``) multiplies its input by a float noise tensor and keeps that tensor for the
backward pass: four bytes per element, as much as the activation itself, in four operators (drawing the mask,
scaling it, the product; the product again backward). ``LeanDropout`` calls ``torch.native_dropout`` on every
device, which ``F.dropout`` uses on a GPU only: it draws a boolean mask (one byte per element, the same Bernoulli draws
as a boolean ``bernoulli_``), scales the kept elements in the same operator, and its backward pass is one operator
too. Outputs and gradients are those of ``nn.Dropout`` with the same mask.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


class LeanDropout(nn.Dropout):
    """``nn.Dropout`` (any shape, ``p`` the drop probability) that keeps a one-byte mask for its backward pass on every
    device (``torch.native_dropout``)."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:  # what nn.Dropout returns, without its call
            return x
        if 0 < self.p < 1 and not self.inplace:
            return torch.native_dropout(x, self.p, True)[0]
        return super().forward(x)
