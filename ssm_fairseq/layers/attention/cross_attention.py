"""Encoder-decoder (cross) attention with the encoder's keys and values cached for incremental decoding."""
from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn


class CrossAttention(nn.Module):
    """Queries from ``x`` (``B x n x D``) attend all of ``memory`` (``B x S x D``): ``B x n x D``.

    Padded memory positions are masked out. With ``cache`` (a dict, ``{}`` at the start of a sequence) the
    memory's keys and values are projected once and reused at every later step. With ``keep_weights`` set (for
    diagnostics: ``ssm-seq2seq-attention``) each call also keeps its attention weights, ``B x heads x n x S``, in
    ``last_weights``.
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be a multiple of attention heads ({heads})")
        self.heads, self.dropout = heads, dropout
        self.q_proj = nn.Linear(dim, dim)
        self.kv_proj = nn.Linear(dim, 2 * dim)
        self.out_proj = nn.Linear(dim, dim)
        self.keep_weights, self.last_weights = False, None

    def forward(self, x: Tensor, memory: Tensor, memory_padding_mask: Tensor | None = None,
                cache: dict | None = None) -> Tensor:
        """``memory_padding_mask``: ``B x S``, True at padded positions."""
        B, n, D = x.shape
        if cache is not None and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            k, v = self.kv_proj(memory).view(B, memory.shape[1], 2, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
            if cache is not None:  # contiguous copies: fused attention reads them faster at every later step
                k, v = k.contiguous(), v.contiguous()
                cache.update(k=k, v=v)
        q = self.q_proj(x).view(B, n, self.heads, D // self.heads).transpose(1, 2)
        mask = None if memory_padding_mask is None else ~memory_padding_mask[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        if self.keep_weights:
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            self.last_weights = (scores if mask is None else scores.masked_fill(~mask, float("-inf"))).softmax(-1)
        return self.out_proj(y.transpose(1, 2).reshape(B, n, D))
