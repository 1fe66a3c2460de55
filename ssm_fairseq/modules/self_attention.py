"""Multi-head self-attention over a padded batch."""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class SelfAttention(nn.Module):
    """Full bidirectional multi-head self-attention: ``B x L x D -> B x L x D``.

    Padded keys are masked out, so real frames never attend to padding. Uses
    ``scaled_dot_product_attention`` (memory-efficient kernels where available).
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be a multiple of attention heads ({heads})")
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """``x``: ``B x L x D``; ``padding_mask``: ``B x L``, True at padded frames."""
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        mask = None if padding_mask is None else ~padding_mask[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(y.transpose(1, 2).reshape(B, L, D))
