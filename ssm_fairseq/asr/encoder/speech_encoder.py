"""A speech encoder: sub-sampler, optional look-ahead, optional sinusoidal positions, a stack of encoder layers, final
LayerNorm."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ...ssm.batched_kernels import generated_together
from ...layers.dropout import LeanDropout
from ...layers.encoder_layer import EncoderLayer, LayerConfig, PreNormResidual
from .lookahead import LookAhead
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
        lookahead_frames: ``K``, sub-sampled frames of look-ahead (``lookahead.LookAhead`` after the sub-sampler:
            output frame ``t`` sees input up to frame ``t + K``); 0 for none (no module, no parameters).
        lookahead_mixing: ``channel`` (per-channel taps) or ``full`` (also a projection of the ``K`` future
            frames' every channel); see ``lookahead.LookAhead``.

    An encoder of causal ``mssm`` layers (``cfg.causal``) on the ``tr`` or ``ms`` sub-sampler, without positions,
    also runs chunk by chunk (``step``): streaming recognition, each frame ``lookahead_frames`` frames late.
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
        lookahead_frames: int = 0,
        lookahead_mixing: str = "channel",
    ):
        super().__init__()
        self.subsampler = build_subsampler(subsampler, input_dim, cfg, conv_channels, tr_stride)
        self.lookahead_frames = lookahead_frames
        if lookahead_frames:
            self.lookahead = LookAhead(cfg.dim, lookahead_frames, lookahead_mixing)
        self.positions = positions
        self.dropout = LeanDropout(cfg.dropout)
        self.layers = nn.ModuleList(EncoderLayer(layer_type, cfg) for _ in range(layers))
        self.final_norm = nn.LayerNorm(cfg.dim)
        self.intermediate_every = intermediate_every

    def forward(self, features: Tensor, lengths: Tensor) -> dict[str, Tensor | list[Tensor]]:
        """``features``: ``B x T x F``, ``lengths``: ``B``.

        Returns a dict: ``encoder_out`` ``B x T' x D``, ``encoder_lengths`` ``B``, ``padding_mask`` ``B x T'``
        (True at padded frames) and ``intermediate``: a list of ``B x T' x D`` outputs of layers k, 2k, ...
        """
        x, lengths, padding_mask = self.subsampler(features, lengths)
        if self.lookahead_frames:
            x = self.lookahead(x, padding_mask)
        if self.positions:
            x = x + sinusoidal_positions(x.shape[1], x.shape[2], x.device).to(x.dtype)
        x = self.dropout(x)
        intermediate = []
        with generated_together(self.layers, x.shape[1], x.shape[0]):  # all layers' MSSM kernels in one call, batched
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

    def check_streamable(self) -> None:
        """Raise ``ValueError`` saying why, unless ``step`` can run this encoder chunk by chunk."""
        if self.positions:
            raise ValueError("an encoder with sinusoidal positions cannot run chunk by chunk")
        if not hasattr(self.subsampler, "step"):
            raise ValueError(f"{type(self.subsampler).__name__} cannot run chunk by chunk: use the tr or ms "
                             "sub-sampler")
        for module in self.modules():
            if isinstance(module, PreNormResidual) and not hasattr(module.block, "step"):
                raise ValueError(f"{type(module.block).__name__} needs the whole utterance: only an encoder of causal "
                                 "mssm layers (--causal-encoder) runs chunk by chunk")

    def step(self, features: Tensor, cache: dict, final: bool = False) -> Tensor:
        """The next feature frames of a stream, ``B x n x F`` (``n`` may be 0) -> the encoder frames they complete,
        ``B x m x D``; ``final``: the stream ends with this chunk (a partial sub-sampling group is completed, and
        the frames held for look-ahead are completed with zeros and returned).

        Over a whole stream, in any chunks, the outputs are ``forward``'s on the whole of it (eval mode). ``cache``
        is a dict owned by the caller, ``{}`` at the start of a stream; it holds the sub-sampler's waiting frames,
        the look-ahead's last ``lookahead_frames`` sub-sampled frames (their outputs wait for their successors:
        ``frames_held``) and every SSM's state, ``O(layers x B x D x N)`` however long the stream.
        """
        if not cache:
            self.check_streamable()
        if cache.get("ended"):
            raise ValueError("the stream has ended (final=True): start a new one with a new cache")
        cache["ended"] = final
        x = self.subsampler.step(features, cache.setdefault("subsampler", {}), final)
        if self.lookahead_frames:
            x = self.lookahead.step(x, cache.setdefault("lookahead", {}), final)
        x = self.dropout(x)
        if x.shape[1]:
            for i, layer in enumerate(self.layers):
                x = layer.step(x, cache.setdefault(i, {}))
        return self.final_norm(x)

    def frames_held(self, cache: dict) -> int:
        """Sub-sampled frames that a stream's ``step`` cache holds back for look-ahead: frames the encoder has taken
        whose outputs it has not given yet (at most ``lookahead_frames``; 0 without look-ahead or for a new cache).
        Fed whole sub-sampling groups, the encoder holds no other frame: these are its last ``frames_held x
        stride`` input frames."""
        return LookAhead.frames_held(cache.get("lookahead", {})) if self.lookahead_frames else 0
