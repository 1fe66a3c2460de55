"""SPADE layers (SPADE paper section 3.2): the global layer (SSM + local attention) and the local layer.

Global layer::

    Xa = W [LN(Local(LN X)), LN(SSM(LN X))] + X
    Y  = FFN(LN Xa) + Xa

Local layer (a pre-LN transformer layer with local attention)::

    Xa = Local(LN X) + X
    Y  = FFN(LN Xa) + Xa
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .causal_ssm import CausalSSM
from .feed_forward import FeedForward
from .local_attention import LocalAttention


class SpadeLayer(nn.Module):
    """A global layer when ``ssm`` is given (``s4``, ``s4d``, ``dss``, ``mssm``), else a local layer.

    ``B x L x D -> B x L x D``. Args: ``window`` and ``attention`` (``window`` or ``chunk``) configure the
    local attention; ``causal`` for decoders (the SSM is then causal too; bidirectional SSMs are not offered
    here); ``ssm_state_size``, ``l_max``, ``frozen_ssm`` (S4's A and B) and ``ssm_heads`` (MSSM) the SSM.
    """

    def __init__(
        self,
        dim: int,
        ffn_dim: int,
        heads: int,
        window: int,
        attention: str = "window",
        causal: bool = True,
        ssm: str | None = None,
        ssm_state_size: int = 64,
        l_max: int = 4096,
        frozen_ssm: bool = True,
        ssm_heads: int = 1,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        activation: str = "gelu",
    ):
        super().__init__()
        if ssm is not None and not causal:
            raise ValueError("the SPADE global layer's SSM is causal; use causal=True")
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = LocalAttention(dim, heads, window, attention, causal, attention_dropout)
        self.ssm = None
        if ssm is not None:
            self.ssm = CausalSSM(dim, ssm, ssm_state_size, l_max, frozen_ssm, ssm_heads)
            self.local_out_norm, self.ssm_out_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.merge = nn.Linear(2 * dim, dim)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim, ffn_dim, activation, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, cache: dict | None = None) -> Tensor:
        """``x``: ``B x L x D`` (with ``cache``: the next positions of a sequence); ``padding_mask``: ``B x L``.

        ``cache`` is a dict (``{}`` at the start of a sequence) holding the attention's keys/values and the
        SSM's state; stepping through a sequence with it gives the same outputs as the full forward.
        """
        h = self.attention_norm(x)
        local = self.attention(h, padding_mask, None if cache is None else cache.setdefault("attention", {}))
        if self.ssm is not None:
            if cache is None:
                g = self.ssm(h, padding_mask)
            else:
                g = self.ssm.step(h, cache.setdefault("ssm", {}))
            local = self.merge(torch.cat([self.local_out_norm(local), self.ssm_out_norm(g)], dim=-1))
        x = x + self.dropout(local)
        return x + self.dropout(self.ffn(self.ffn_norm(x)))

    def reorder_cache(self, cache: dict, new_order: Tensor) -> None:
        """Beam search: keep the batch rows ``new_order`` of every cached state."""
        if "attention" in cache:
            LocalAttention.reorder_cache(cache["attention"], new_order)
        if "state" in cache.get("ssm", {}):
            cache["ssm"]["state"] = cache["ssm"]["state"].index_select(0, new_order)
