"""SPADE layers (SPADE paper section 3.2): the global layer (SSM + local attention) and the local layer.

Global layer (pre-LN, as in the decoder-only LM)::

    Xa = W [LN(Local(LN X)), LN(SSM(LN X))] + X
    Y  = FFN(LN Xa) + Xa

Local layer (a pre-LN transformer layer with local attention)::

    Xa = Local(LN X) + X
    Y  = FFN(LN Xa) + Xa

With ``post_norm`` (the encoder-decoder of section 5.1) every sub-layer reads ``X`` itself and the LayerNorm
follows the residual: ``Xa = LN(X + W [LN(Local(X)), LN(SSM(X))])``, ``Y = LN(Xa + FFN(Xa))``. A decoder layer
(``cross_attention``) has encoder-decoder attention between the two. Encoder layers (``causal=False``) use a
bidirectional SSM: the S4-LegS (or MSSM) block of ``bidirectional_ssm`` with one stage and GELU.

``W`` reads two LayerNorm outputs (norm ``sqrt(2 D)`` together), so with PyTorch's default initialisation its output
is several times the embeddings' scale and the layer's input reaches the next layer mostly through ``W``'s random
projection of a window average: at the sample seq2seq size a token's own embedding keeps a cosine of 0.13 after
the global layer (0.81 after a local layer). ``merge_init_scale`` multiplies ``W``'s initial weights (1: the
default; 0.1 keeps 0.75; tested).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .state_space.bidirectional_ssm import BidirectionalSSM
from .state_space.causal_ssm import CausalSSM
from .attention.cross_attention import CrossAttention
from .dropout import LeanDropout
from .feed_forward import FeedForward
from .attention.local_attention import LocalAttention
from .recompute import recomputed

BIDIRECTIONAL_SSMS = ("s4", "mssm")


class SpadeLayer(nn.Module):
    """A global layer when ``ssm`` is given (``s4``, ``s4d``, ``dss``, ``mssm``; bidirectional: ``s4``, ``mssm``),
    else a local layer.

    ``B x L x D -> B x L x D``. Args: ``window`` and ``attention`` (``window`` or ``chunk``) configure the
    local attention; ``causal`` for decoders (the SSM is then causal too); ``ssm_state_size``, ``l_max``,
    ``frozen_ssm`` (S4's A and B) and ``ssm_heads`` (MSSM) the SSM; ``post_norm``, ``cross_attention`` and
    ``merge_init_scale`` (of ``W``'s initial weights) as in the module docstring.
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
        post_norm: bool = False,
        cross_attention: bool = False,
        merge_init_scale: float = 1.0,
    ):
        super().__init__()
        self.post_norm = post_norm
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = LocalAttention(dim, heads, window, attention, causal, attention_dropout)
        self.ssm = None
        if ssm is not None:
            if causal:
                self.ssm = CausalSSM(dim, ssm, ssm_state_size, l_max, frozen_ssm, ssm_heads)
            elif ssm in BIDIRECTIONAL_SSMS:
                frozen = {}
                if ssm == "s4":
                    frozen = dict(trainable_A=not frozen_ssm, trainable_B=not frozen_ssm, l_max=l_max)
                self.ssm = BidirectionalSSM(dim, heads=ssm_heads if ssm == "mssm" else 1, stack=1, gating="gelu",
                                            state_size=ssm_state_size, kernel=ssm, recompute_stages=False, **frozen)
            else:
                raise ValueError(f"a bidirectional global layer's SSM must be one of {BIDIRECTIONAL_SSMS}, got {ssm!r}")
            self.local_out_norm, self.ssm_out_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.merge = nn.Linear(2 * dim, dim)
            with torch.no_grad():
                self.merge.weight.mul_(merge_init_scale)
        self.cross_attention = None
        if cross_attention:
            self.cross_norm = nn.LayerNorm(dim)
            self.cross_attention = CrossAttention(dim, heads, attention_dropout)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim, ffn_dim, activation, dropout)
        self.dropout = LeanDropout(dropout)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, cache: dict | None = None,
                position_bias: nn.Module | None = None, encoder_out: Tensor | None = None,
                encoder_padding_mask: Tensor | None = None) -> Tensor:
        """``x``: ``B x L x D`` (with ``cache``: the next positions of a sequence); ``padding_mask``: ``B x L``.

        ``cache`` is a dict (``{}`` at the start of a sequence) holding the attention's keys/values, the SSM's
        state and the encoder's projected keys/values; stepping through a sequence with it gives the same
        outputs as the full forward. ``position_bias``: T5's relative position bias of the stack (optional).
        ``encoder_out`` (``B x S x D``) and ``encoder_padding_mask`` (``B x S``): for cross-attention.
        """
        h = self._input(x, self.attention_norm)
        local = self.attention(h, padding_mask, None if cache is None else cache.setdefault("attention", {}),
                               position_bias)
        return self._after_attention(x, h, local, padding_mask, cache, encoder_out, encoder_padding_mask)

    def step_stored(self, x: Tensor, store: Tensor, first: int, slots: Tensor, key_ok: Tensor,
                    ssm_cache: dict | None) -> Tensor:
        """One new token per row (``x``: ``B x 1 x D``), its attention's keys and values in a token store
        (``LocalAttention.step_stored``: ``store``, ``first``, ``slots``, ``key_ok``) and its SSM state in
        ``ssm_cache`` (``CausalSSM.step``'s dict, updated in place; None for a local layer) -> ``B x 1 x D``, what
        ``forward`` gives with each row's own cache."""
        if self.cross_attention is not None:
            raise ValueError("a token store holds no encoder keys: step_stored steps decoder-only layers")
        h = self._input(x, self.attention_norm)
        local = self.attention.step_stored(h, store, first, slots, key_ok)
        return self._after_attention(x, h, local, None, {} if ssm_cache is None else {"ssm": ssm_cache})

    def _after_attention(self, x: Tensor, h: Tensor, local: Tensor, padding_mask: Tensor | None, cache: dict | None,
                         encoder_out: Tensor | None = None, encoder_padding_mask: Tensor | None = None) -> Tensor:
        """The layer after its local attention (``local``, of the sub-layer's input ``h``): the SSM branch and the
        merge (global layer), the residual, cross-attention, the FFN."""
        if self.ssm is not None:
            if cache is None:
                g = recomputed(self._ssm_branch, h, padding_mask)
            else:
                g = self.ssm_out_norm(self.ssm.step(h, cache.setdefault("ssm", {})))
            local = self.merge(torch.cat([self.local_out_norm(local), g], dim=-1))
        x = self._residual(x, local, self.attention_norm)
        if self.cross_attention is not None:
            c = self.cross_attention(self._input(x, self.cross_norm), encoder_out, encoder_padding_mask,
                                     None if cache is None else cache.setdefault("cross", {}))
            x = self._residual(x, c, self.cross_norm)
        return self._residual(x, self.ffn(self._input(x, self.ffn_norm)), self.ffn_norm)

    def _ssm_branch(self, h: Tensor, padding_mask: Tensor | None) -> Tensor:
        """``LN(SSM(h))``: ``B x L x D``. In training on a CPU it runs again in the backward pass
        (``recompute.recomputed``), so that only ``h``, which the attention keeps anyway, is kept for it: not the
        kernel generation's intermediates, the FFT convolution's spectra or the activations (several times
        ``B x L x D``)."""
        return self.ssm_out_norm(self.ssm(h, padding_mask))

    def _input(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        """What a sub-layer reads: ``LN(x)`` before it (pre-norm) or ``x`` itself (post-norm)."""
        return x if self.post_norm else norm(x)

    def _residual(self, x: Tensor, y: Tensor, norm: nn.LayerNorm) -> Tensor:
        """``x + Dropout(y)``, LayerNorm-ed after the sum with ``post_norm``."""
        x = x + self.dropout(y)
        return norm(x) if self.post_norm else x

    def reorder_cache(self, cache: dict, new_order: Tensor) -> None:
        """Beam search: keep the batch rows ``new_order`` of every cached state."""
        for part in ("attention", "cross"):
            if part in cache:
                LocalAttention.reorder_cache(cache[part], new_order)
        if "state" in cache.get("ssm", {}):
            cache["ssm"]["state"] = cache["ssm"]["state"].index_select(0, new_order)
