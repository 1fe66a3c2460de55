"""A speech encoder: sub-sampler, optional sinusoidal positions, a stack of encoder layers, final LayerNorm."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .encoder_layer import EncoderLayer, LayerConfig
from .subsampling import build_subsampler


def sinusoidal_positions(length: int, dim: int, device: torch.device) -> Tensor:
    """``length x dim`` sinusoids (Vaswani et al., 2017): sines in the first half, cosines in the second."""
    half = dim // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, device=device) / max(half - 1, 1))
    angle = torch.arange(length, device=device).unsqueeze(1) * freq
    return torch.cat([torch.sin(angle), torch.cos(angle), angle.new_zeros(length, dim % 2)], dim=1)


class SpeechEncoder(nn.Module):
    """``features: B x T x F`` -> ``B x T' x D`` at the sub-sampled frame rate.

    Args:
        layer_type: ``mssm``, ``stateformer``, ``transformer``, ``conformer`` or ``s4`` (see ``encoder_layer``).
        layers: number of encoder layers.
        cfg: layer hyperparameters (``cfg.dim`` is the encoder width).
        input_dim: filterbank bins (80).
        subsampler: ``conv``, ``tr`` or ``ms``; ``conv_channels`` and ``tr_stride`` configure the first two.
        positions: add sinusoidal positions after sub-sampling (attention-only baselines need them; SSM and
            convolution layers are position-aware by construction).
        intermediate_every: also return the (LayerNorm-ed) output of every k-th layer below the top, for
            auxiliary losses; 0 for none.
    """

    def __init__(
        self,
        layer_type: str,
        layers: int,
        cfg: LayerConfig,
        input_dim: int = 80,
        subsampler: str = "ms",
        conv_channels: int = 64,
        tr_stride: int = 4,
        positions: bool = False,
        intermediate_every: int = 0,
    ):
        super().__init__()
        self.subsampler = build_subsampler(subsampler, input_dim, cfg, conv_channels, tr_stride)
        self.positions = positions
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(EncoderLayer(layer_type, cfg) for _ in range(layers))
        self.final_norm = nn.LayerNorm(cfg.dim)
        self.intermediate_every = intermediate_every

    def forward(self, features: Tensor, lengths: Tensor) -> dict[str, Tensor | list[Tensor]]:
        """``features``: ``B x T x F``, ``lengths``: ``B``.

        Returns a dict: ``encoder_out`` ``B x T' x D``, ``encoder_lengths`` ``B``, ``padding_mask`` ``B x T'``
        (True at padded frames) and ``intermediate``: a list of ``B x T' x D`` outputs of layers k, 2k, ...
        """
        x, lengths, padding_mask = self.subsampler(features, lengths)
        if self.positions:
            x = x + sinusoidal_positions(x.shape[1], x.shape[2], x.device).to(x.dtype)
        x = self.dropout(x)
        intermediate = []
        for i, layer in enumerate(self.layers, start=1):
            x = layer(x, padding_mask)
            if self.intermediate_every and i % self.intermediate_every == 0 and i < len(self.layers):
                intermediate.append(self.final_norm(x))
        return {
            "encoder_out": self.final_norm(x),
            "encoder_lengths": lengths,
            "padding_mask": padding_mask,
            "intermediate": intermediate,
        }
