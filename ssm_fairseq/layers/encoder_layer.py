"""Pre-norm encoder layers: the MSSM and Stateformer layers and the baselines of the MSSM paper's Table 2.

Every layer is a chain of pre-norm residual blocks ``x + Dropout(Block(LN(x)))``:

==============  ================================================================
``mssm``        bidirectional MSSM block (Eq. 10), FFN
``stateformer`` bidirectional MSSM block, self-attention, FFN (Fig. 3)
``transformer`` self-attention, FFN
``conformer``   convolution module (kernel 31), self-attention, FFN, LayerNorm
                (convolution before attention, no macaron FFN, as in section 4.1)
``s4``          bidirectional single-head S4-LegS block (GLU, same stacking and state size), FFN
``local``       bidirectional sliding-window self-attention (``attention_window`` keys on each side), FFN
                (the sliding-window baseline of the MSSM paper's Table 4)
==============  ================================================================

With ``causal=True`` no output depends on a later frame: the MSSM block keeps its forward direction only (one
stacked multi-head SSM with its own final Linear, in place of Eq. 10's two directions and ``2D -> D`` Linear) and
self-attention is masked to the past. Causal ``mssm`` layers also run chunk by chunk (``step``), carrying their SSM
states across chunks: the streaming encoder. ``conformer`` (a centred convolution), ``s4`` and ``local`` have no
causal form here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from torch import Tensor, nn

from .state_space.bidirectional_ssm import BidirectionalSSM
from .conformer_convolution import ConformerConvolution
from .dropout import LeanDropout
from .feed_forward import FeedForward
from .attention.local_attention import LocalAttention
from .state_space.multihead_ssm import MultiHeadSSM
from .attention.self_attention import SelfAttention

LAYER_TYPES = ("mssm", "stateformer", "transformer", "conformer", "s4", "local")


@dataclass(frozen=True)
class LayerConfig:
    """Hyperparameters shared by all layer types (defaults: the paper's base configuration)."""

    dim: int = 512
    ffn_dim: int = 2048
    ffn_activation: str = "gelu"
    attention_heads: int = 8
    ssm_heads: int = 4
    ssm_gating: str = "ihg"
    ssm_stack: int = 2
    ssm_state_size: int = 32
    mssm_scale: float | tuple[float, ...] = 0.5  # one for all heads, or one per head
    s4_l_max: int = 2048
    conv_kernel_size: int = 31
    attention_window: int = 128
    dropout: float = 0.1
    causal: bool = False

    def widened(self, dim: int) -> LayerConfig:
        """The same layer at another width (FFN kept at the same expansion)."""
        return replace(self, dim=dim, ffn_dim=self.ffn_dim * dim // self.dim)


def _mssm_block(cfg: LayerConfig) -> nn.Module:
    args = dict(heads=cfg.ssm_heads, stack=cfg.ssm_stack, gating=cfg.ssm_gating, state_size=cfg.ssm_state_size,
                kernel="mssm", dropout=cfg.dropout, scale=cfg.mssm_scale)
    return MultiHeadSSM(cfg.dim, **args) if cfg.causal else BidirectionalSSM(cfg.dim, **args)


def _s4_block(cfg: LayerConfig) -> nn.Module:
    return BidirectionalSSM(
        cfg.dim, heads=1, stack=cfg.ssm_stack, gating="glu", state_size=cfg.ssm_state_size, kernel="s4",
        dropout=cfg.dropout, l_max=cfg.s4_l_max,
    )


CAUSAL_LAYER_TYPES = ("mssm", "stateformer", "transformer")


def _blocks(layer_type: str, cfg: LayerConfig) -> list[nn.Module]:
    if cfg.causal and layer_type not in CAUSAL_LAYER_TYPES:
        raise ValueError(f"a causal encoder needs layers of type {' or '.join(CAUSAL_LAYER_TYPES)}, got {layer_type!r}")
    attention = lambda: SelfAttention(cfg.dim, cfg.attention_heads, cfg.dropout, cfg.causal)  # noqa: E731
    ffn = FeedForward(cfg.dim, cfg.ffn_dim, cfg.ffn_activation, cfg.dropout)
    if layer_type == "mssm":
        return [_mssm_block(cfg), ffn]
    if layer_type == "stateformer":
        return [_mssm_block(cfg), attention(), ffn]
    if layer_type == "transformer":
        return [attention(), ffn]
    if layer_type == "conformer":
        return [ConformerConvolution(cfg.dim, cfg.conv_kernel_size, cfg.dropout), attention(), ffn]
    if layer_type == "s4":
        return [_s4_block(cfg), ffn]
    if layer_type == "local":
        return [LocalAttention(cfg.dim, cfg.attention_heads, cfg.attention_window, "window", dropout=cfg.dropout), ffn]
    raise ValueError(f"layer type must be one of {LAYER_TYPES}, got {layer_type!r}")


class PreNormResidual(nn.Module):
    """``x + Dropout(block(LayerNorm(x), padding_mask))``."""

    def __init__(self, block: nn.Module, dim: int, dropout: float):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.block = block
        self.dropout = LeanDropout(dropout)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        return x + self.dropout(self.block(self.norm(x), padding_mask))

    def step(self, x: Tensor, cache: dict) -> Tensor:
        """The next ``n`` frames of a stream, ``B x n x D``; ``cache``: the block's state, ``{}`` at the start."""
        if not hasattr(self.block, "step"):
            raise ValueError(f"{type(self.block).__name__} needs the whole sequence: it cannot run chunk by chunk")
        return x + self.dropout(self.block.step(self.norm(x), cache))


class EncoderLayer(nn.Module):
    """One encoder layer of type ``layer_type`` (see the module docstring): ``B x L x D -> B x L x D``."""

    def __init__(self, layer_type: str, cfg: LayerConfig):
        super().__init__()
        self.blocks = nn.ModuleList(PreNormResidual(b, cfg.dim, cfg.dropout) for b in _blocks(layer_type, cfg))
        self.final_norm = nn.LayerNorm(cfg.dim) if layer_type == "conformer" else nn.Identity()

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """``x``: ``B x L x D``; ``padding_mask``: ``B x L``, True at padded frames."""
        for block in self.blocks:
            x = block(x, padding_mask)
        return self.final_norm(x)

    def step(self, x: Tensor, cache: dict) -> Tensor:
        """The next ``n`` frames of a stream: ``B x n x D`` -> ``B x n x D``, equal to ``forward``'s output at those
        frames over the whole stream. ``cache``: a dict owned by the caller, ``{}`` at the start of a stream."""
        for i, block in enumerate(self.blocks):
            x = block.step(x, cache.setdefault(i, {}))
        return self.final_norm(x)
