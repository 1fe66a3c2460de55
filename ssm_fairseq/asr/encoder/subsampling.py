"""Sub-samplers: from 10 ms filterbank frames to the 40 ms encoder frame rate (MSSM paper section 4.1).

Each maps ``features: B x T x F`` and ``lengths: B`` to ``(x: B x T' x D, lengths': B, padding_mask: B x T')``
(``padding_mask`` True at padded frames). Frames past an utterance's length never influence its outputs.

* ``conv``: two 3x3 stride-2 ``Conv2d`` with ReLU over (time, frequency), then ``Linear`` to ``D`` (the
  paper's "512 output channels"). The paper's totals (Table 2: Transformer 77.5M with conv, 76.7M with tr)
  leave about 0.8M parameters for it, which 64 convolution channels give (0.66M); ESPnet's 512 would be 7.3M.
* ``tr``: ``Linear(F, D / stride)``, then time reduction stacking each ``stride`` frames (``D = 512``,
  stride 4: ``Linear(80, 128)``, as in the paper).
* ``ms``: multi-scale, ``Linear(F, D / 4)``, 2 MSSM layers, TR(2), 4 MSSM layers, TR(2) (``D = 512``:
  ``128 -> 256 -> 512``).

``tr`` and ``ms`` (with causal MSSM layers) also run chunk by chunk (``step``): frames wait in the cache until a
group of ``stride`` is complete, and the stream's last, partial group is completed with zeros, as ``time_reduction``
completes an utterance's. ``conv`` looks two frames ahead within each stride and has no chunk form.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...ssm.batched_kernels import generated_together
from ...layers.encoder_layer import EncoderLayer, LayerConfig


def lengths_to_padding_mask(lengths: Tensor, max_length: int) -> Tensor:
    """``B`` lengths -> ``B x max_length`` mask, True at padded positions."""
    return torch.arange(max_length, device=lengths.device) >= lengths.unsqueeze(1)


def time_reduction(x: Tensor, lengths: Tensor, stride: int) -> tuple[Tensor, Tensor]:
    """Stack each ``stride`` consecutive frames: ``B x T x D -> B x ceil(T/stride) x stride*D``.

    Frames past each length are zeroed first, so a partial last group sees zeros exactly as the utterance
    would alone.
    """
    B, T, D = x.shape
    x = x.masked_fill(lengths_to_padding_mask(lengths, T).unsqueeze(-1), 0.0)
    x = F.pad(x, (0, 0, 0, -T % stride))
    return x.reshape(B, -1, stride * D), torch.div(lengths + stride - 1, stride, rounding_mode="floor")


def time_reduction_step(x: Tensor, cache: dict, stride: int, final: bool) -> Tensor:
    """Chunk form of ``time_reduction``: ``B x n x D`` new frames -> ``B x m x stride*D`` completed groups.

    Frames that do not fill a group wait in ``cache`` for the next chunk; ``final`` completes the last group with
    zeros (the stream ends). Over a whole stream this returns ``time_reduction``'s output.
    """
    pending = cache.pop("pending", None)
    if pending is not None:
        x = torch.cat([pending, x], dim=1)
    B, T, D = x.shape
    complete = T // stride * stride
    if final:
        x, complete = F.pad(x, (0, 0, 0, -T % stride)), T + -T % stride
    elif complete < T:
        cache["pending"] = x[:, complete:]
    return x[:, :complete].reshape(B, -1, stride * D)


class ConvSubsampler(nn.Module):
    """Two ``Conv2d(kernel 3, stride 2)`` + ReLU over (time, frequency), then ``Linear(channels * F', D)``."""

    def __init__(self, input_dim: int, dim: int, channels: int = 64):
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(1, channels, 3, stride=2), nn.ReLU(), nn.Conv2d(channels, channels, 3, stride=2), nn.ReLU()
        )
        freq = ((input_dim - 1) // 2 - 1) // 2
        if freq < 1:
            raise ValueError(f"the conv sub-sampler needs at least 7 feature bins, got {input_dim}")
        self.out_proj = nn.Linear(channels * freq, dim)

    def forward(self, features: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        short = max(0, 7 - features.shape[1])  # both convolutions need input; such batches keep no frames
        x = self.convs(F.pad(features, (0, 0, 0, short)).unsqueeze(1))  # B x channels x T' x F'
        B, C, T, Fr = x.shape
        x = self.out_proj(x.permute(0, 2, 1, 3).reshape(B, T, C * Fr))
        for _ in range(2):  # an unpadded 3-tap stride-2 conv keeps floor((n - 1) / 2) frames
            lengths = torch.div(lengths - 1, 2, rounding_mode="floor").clamp(min=0)
        return x, lengths, lengths_to_padding_mask(lengths, T)


class TimeReductionSubsampler(nn.Module):
    """``Linear(F, D / stride)``, then stack each ``stride`` frames into one of width ``D``."""

    def __init__(self, input_dim: int, dim: int, stride: int = 4):
        super().__init__()
        if stride < 1 or dim % stride:
            raise ValueError(f"the tr sub-sampler needs dim ({dim}) to be a multiple of its stride ({stride})")
        self.stride = stride
        self.in_proj = nn.Linear(input_dim, dim // stride)

    def forward(self, features: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x, lengths = time_reduction(self.in_proj(features), lengths, self.stride)
        return x, lengths, lengths_to_padding_mask(lengths, x.shape[1])

    def step(self, features: Tensor, cache: dict, final: bool = False) -> Tensor:
        """The next ``B x n x F`` frames of a stream -> the ``B x m x D`` output frames they complete (``final``:
        the stream ends here). ``cache``: a dict owned by the caller, ``{}`` at the start of a stream."""
        return time_reduction_step(self.in_proj(features), cache, self.stride, final)


class MultiScaleSubsampler(nn.Module):
    """``Linear(F, D/4)``, 2 MSSM layers, TR(2), 4 MSSM layers, TR(2) -> ``D`` (MSSM paper section 3.6).

    The MSSM layers are full encoder layers (MSSM block and FFN) built from ``cfg`` at widths ``D/4`` and
    ``D/2`` (the FFN keeps its expansion factor).
    """

    def __init__(self, input_dim: int, cfg: LayerConfig, layers: tuple[int, int] = (2, 4)):
        super().__init__()
        if cfg.dim % 4:
            raise ValueError(f"the ms sub-sampler needs dim to be a multiple of 4, got {cfg.dim}")
        self.in_proj = nn.Linear(input_dim, cfg.dim // 4)
        self.scales = nn.ModuleList(
            nn.ModuleList(EncoderLayer("mssm", cfg.widened(cfg.dim // 4 * 2**i)) for _ in range(n))
            for i, n in enumerate(layers)
        )

    def forward(self, features: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = self.in_proj(features)
        for layers in self.scales:
            mask = lengths_to_padding_mask(lengths, x.shape[1])
            with generated_together(layers, x.shape[1], x.shape[0]):  # the scale's MSSM kernels in one call, batched
                for layer in layers:
                    x = layer(x, mask)
            x, lengths = time_reduction(x, lengths, 2)
        return x, lengths, lengths_to_padding_mask(lengths, x.shape[1])

    def step(self, features: Tensor, cache: dict, final: bool = False) -> Tensor:
        """The next ``B x n x F`` frames of a stream -> the ``B x m x D`` output frames they complete (``final``:
        the stream ends here; causal MSSM layers only). ``cache``: a dict owned by the caller, ``{}`` at first."""
        x = self.in_proj(features)
        for i, layers in enumerate(self.scales):
            if x.shape[1]:  # a chunk may complete no frame at this scale
                for j, layer in enumerate(layers):
                    x = layer.step(x, cache.setdefault((i, j), {}))
            x = time_reduction_step(x, cache.setdefault(i, {}), 2, final)
        return x


SUBSAMPLERS = ("conv", "tr", "ms")


def subsampling_stride(name: str, tr_stride: int = 4) -> int:
    """Input frames per output frame of the sub-sampler ``name``."""
    return tr_stride if name == "tr" else 4


def build_subsampler(name: str, input_dim: int, cfg: LayerConfig, conv_channels: int = 64, tr_stride: int = 4):
    """The sub-sampler ``name`` (``conv``, ``tr`` or ``ms``) from ``input_dim`` features to ``cfg.dim``."""
    if name == "conv":
        return ConvSubsampler(input_dim, cfg.dim, conv_channels)
    if name == "tr":
        return TimeReductionSubsampler(input_dim, cfg.dim, tr_stride)
    if name == "ms":
        return MultiScaleSubsampler(input_dim, cfg)
    raise ValueError(f"sub-sampler must be one of {SUBSAMPLERS}, got {name!r}")
