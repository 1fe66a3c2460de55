"""The bidirectional SSM block (MSSM paper Eq. 10)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..ssm.batched_kernels import layer_kernels
from ..ssm.chunked_conv import DiagonalSystem
from ..ssm.fft_conv import two_way_fft_conv
from .multihead_ssm import MultiHeadSSM, linear_channels_first


class BidirectionalSSM(nn.Module):
    """``Linear(Cat[MSSM(x), Rev(MSSM(Rev(x)))])``: ``B x L x D -> B x L x D``.

    Two independent stacked multi-head SSMs, one causal and one anti-causal, each without its last Linear
    (their activations are the ``Act`` of Eq. 10), concatenated and projected from ``2D`` back to ``D``. On a
    GPU the kernels of both directions are generated in one call (``ssm.batched_kernels``). Each stage of both
    directions is one convolution (``two_way_fft_conv``: one FFT pair over the ``2D`` channels), except where a
    direction runs its own way (kernels convolved chunk by chunk, or stages recomputed: at document lengths on a
    CPU). The directions keep their own modules and parameters: they are merged at compute time only.
    Arguments as in ``MultiHeadSSM``. With ``kernel="s4", heads=1, stack=1`` this is the S4-LegS baseline block.
    """

    def __init__(self, dim: int, **mssm_args):
        super().__init__()
        self.forward_ssm = MultiHeadSSM(dim, reverse=False, output_linear=False, **mssm_args)
        self.backward_ssm = MultiHeadSSM(dim, reverse=True, output_linear=False, **mssm_args)
        self.out_proj = nn.Linear(2 * dim, dim)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """``x``: ``B x L x D``; ``padding_mask``: ``B x L``, True at padded frames."""
        stages = len(self.forward_ssm.kernels)
        kernels = layer_kernels([*self.forward_ssm.kernels, *self.backward_ssm.kernels], x.shape[1])
        forward_kernels, backward_kernels = kernels[:stages], kernels[stages:]
        if self.forward_ssm.recomputes(x.shape[1]) or any(isinstance(k, DiagonalSystem) for k in kernels):
            y = torch.cat([self.forward_ssm(x, padding_mask, forward_kernels),
                           self.backward_ssm(x, padding_mask, backward_kernels)], dim=-1)
        else:
            y = self._both_ways(x, padding_mask, forward_kernels, backward_kernels)
        return self.out_proj(y)

    def _both_ways(self, x: Tensor, padding_mask: Tensor | None, forward_kernels: list,
                   backward_kernels: list) -> Tensor:
        """Both directions' stages, each stage one convolution of their ``B x 2D x L`` concatenated inputs:
        ``B x L x D`` -> ``B x L x 2D`` (the two directions' activations side by side)."""
        directions = (self.forward_ssm, self.backward_ssm)
        x = x.transpose(1, 2)
        h = [ssm.projected(x) for ssm in directions]  # each B x D x L
        for i, kernels in enumerate(zip(forward_kernels, backward_kernels)):
            y = two_way_fft_conv(torch.cat(h, dim=1), *kernels, padding_mask)  # B x C x 2D x L
            h = [ssm.activated(part) for ssm, part in zip(directions, y.chunk(2, dim=2))]
            if i < len(self.forward_ssm.linears):
                h = [linear_channels_first(ssm.linears[i], a) for ssm, a in zip(directions, h)]
        return torch.cat([a.transpose(1, 2) for a in h], dim=-1)
