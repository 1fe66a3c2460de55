"""The bidirectional SSM block (MSSM paper Eq. 10)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..ssm.batched_kernels import layer_kernels
from .multihead_ssm import MultiHeadSSM


class BidirectionalSSM(nn.Module):
    """``Linear(Cat[MSSM(x), Rev(MSSM(Rev(x)))])``: ``B x L x D -> B x L x D``.

    Two independent stacked multi-head SSMs, one causal and one anti-causal, each without its last Linear
    (their activations are the ``Act`` of Eq. 10), concatenated and projected from ``2D`` back to ``D``. On a
    GPU the kernels of both directions are generated in one call (``ssm.batched_kernels``).
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
        y = torch.cat([self.forward_ssm(x, padding_mask, kernels[:stages]),
                       self.backward_ssm(x, padding_mask, kernels[stages:])], dim=-1)
        return self.out_proj(y)
