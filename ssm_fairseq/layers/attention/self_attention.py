"""Multi-head self-attention over a padded batch."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class SelfAttention(nn.Module):
    """Full multi-head self-attention: ``B x L x D -> B x L x D``, bidirectional, or ``causal`` (frame ``i``
    attends frames ``j <= i``: its whole left context, recomputed at every call).

    Padded keys are masked out, so real frames never attend to padding. Uses
    ``scaled_dot_product_attention`` (memory-efficient kernels where available).
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, causal: bool = False):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be a multiple of attention heads ({heads})")
        self.heads, self.dropout, self.causal = heads, dropout, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """``x``: ``B x L x D``; ``padding_mask``: ``B x L``, True at padded frames."""
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        mask = None if padding_mask is None else ~padding_mask[:, None, None, :]
        if self.causal:
            past = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
            mask = past if mask is None else mask & past
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(y.transpose(1, 2).reshape(B, L, D))
