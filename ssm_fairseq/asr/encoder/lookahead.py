"""Bounded look-ahead for a causal encoder: each sub-sampled frame mixed with its ``K`` successors.

A row convolution (the look-ahead layer of Deep Speech 2, Amodei et al., 2016): per channel ``d``,

    y[t, d] = sum_{k=0..K} w[d, k] * x[t + k, d]        (x past the utterance's end: zeros)

between the sub-sampler and the causal encoder layers. It is the only part of the encoder that sees the future, so
frame ``t`` of the encoder's output depends on the features up to sub-sampled frame ``t + K`` and no further: a
stream's frame ``t`` waits for frame ``t + K`` (``K`` x the frame duration of latency: 40 ms per frame at the
sub-sampling stride 4), and every layer above it still sees ``K`` frames of the future. Per channel, with the
layers' input projections to mix the channels: ``D x (K + 1)`` parameters, initialised to the identity (``w[:, 0] =
1``, the other taps 0: at initialisation, the causal encoder without look-ahead).

With ``mixing="full"`` the layer also mixes channels across the future: a projection of the ``K`` future frames,

    y[t] += W [x[t + 1]; ...; x[t + K]]                     (W: D x K D, initialised to 0)

``K D^2`` more parameters, so that every channel of frame ``t`` can draw on every channel of its successors before
the first causal layer (the per-channel taps alone leave that to the layers' input projections, one frame at a
time). At initialisation it is the same identity.

``step`` runs it chunk by chunk: the last ``K`` frames of each chunk wait in the cache for their successors, and the
stream's end (``final``) completes them with zeros, as an utterance's end is. The sum is taken tap by tap in one
order, so a frame's output is the same number computed whole or in any chunks (exactly in any precision per
channel; to the rounding of one matrix product, row by row, with ``mixing="full"``).

Imports only torch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


MIXINGS = ("channel", "full")


class LookAhead(nn.Module):
    """``B x T x D`` -> ``B x T x D``: frame ``t`` a per-channel weighted sum of frames ``t .. t + frames`` (and,
    with ``mixing="full"``, a projection of its ``frames`` successors' every channel)."""

    def __init__(self, dim: int, frames: int, mixing: str = "channel"):
        super().__init__()
        if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
            raise ValueError(f"a look-ahead layer needs at least 1 future frame, got {frames!r}")
        if mixing not in MIXINGS:
            raise ValueError(f"look-ahead mixing must be one of {', '.join(MIXINGS)}, got {mixing!r}")
        self.frames = frames
        weight = torch.zeros(dim, frames + 1)
        weight[:, 0] = 1.0
        self.weight = nn.Parameter(weight)
        self.future = nn.Linear(frames * dim, dim, bias=False) if mixing == "full" else None
        if self.future is not None:
            nn.init.zeros_(self.future.weight)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """``x``: ``B x T x D``; ``padding_mask``: ``B x T``, True at padded frames, which count as zeros (an
        utterance's last frames look ahead into zeros, padded in a batch or alone). Returns ``B x T x D``."""
        if padding_mask is not None:
            x = x.masked_fill(padding_mask.unsqueeze(-1), 0.0)
        return self._mix(F.pad(x, (0, 0, 0, self.frames)))

    def _mix(self, x: Tensor) -> Tensor:
        """``B x (n + K) x D`` -> the ``B x n x D`` frames whose ``K`` successors are all in ``x``."""
        n = x.shape[1] - self.frames
        out = x[:, :n] * self.weight[:, 0]
        for k in range(1, self.frames + 1):
            out = out + x[:, k:k + n] * self.weight[:, k]
        if self.future is not None:
            out = out + self.future(torch.cat([x[:, k:k + n] for k in range(1, self.frames + 1)], dim=-1))
        return out

    def step(self, x: Tensor, cache: dict, final: bool = False) -> Tensor:
        """The next ``B x n x D`` frames of a stream (``n`` may be 0) -> the ``B x m x D`` output frames whose ``K``
        successors have now arrived (all the frames held, ``final``: the stream ends here, its end completed with
        zeros). ``cache``: a dict owned by the caller, ``{}`` at the start of a stream; it holds the last ``min(K,
        frames so far)`` frames under ``"held"`` (``frames_held``)."""
        held = cache.pop("held", None)
        if held is not None:
            x = torch.cat([held, x], dim=1)
        if final:
            return self._mix(F.pad(x, (0, 0, 0, self.frames)))
        ready = max(x.shape[1] - self.frames, 0)
        cache["held"] = x[:, ready:]
        return self._mix(x) if ready else x[:, :0]

    @staticmethod
    def frames_held(cache: dict) -> int:
        """How many frames of a stream wait in its ``step`` cache for their successors (0 for a new cache)."""
        held = cache.get("held")
        return 0 if held is None else held.shape[1]

    def extra_repr(self) -> str:
        mixing = "channel" if self.future is None else "full"
        return f"dim={self.weight.shape[0]}, frames={self.frames}, mixing={mixing}"
