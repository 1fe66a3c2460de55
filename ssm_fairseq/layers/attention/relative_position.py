"""T5's relative position bias (Raffel et al., 2020): a learned scalar per head and distance bucket.

Distances ``j - i`` (key minus query) fall into ``buckets`` buckets: half of them (a quarter each way when
bidirectional) hold the exact small distances, the rest cover larger ones on a log scale up to
``max_distance``; every farther distance shares the last bucket. One table serves all layers of a stack.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def relative_position_bucket(relative: Tensor, bidirectional: bool, buckets: int = 32,
                             max_distance: int = 128) -> Tensor:
    """Bucket index (``0 .. buckets-1``) of each key-minus-query distance in ``relative`` (integer tensor).

    Bidirectional: keys after the query use the upper half of the buckets. Causal: keys after the query (never
    attended) share bucket 0 with distance 0.
    """
    bucket = torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        bucket = bucket + (relative > 0).long() * buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp_min(0)
    exact = buckets // 2
    # log-spaced buckets for exact <= distance < max_distance (the clamp keeps log() away from 0)
    log_ratio = torch.log(distance.clamp_min(exact).float() / exact) / math.log(max_distance / exact)
    large = (exact + (log_ratio * (buckets - exact)).long()).clamp_max(buckets - 1)
    return bucket + torch.where(distance < exact, distance, large)


class RelativePositionBias(nn.Module):
    """``relative`` (``...`` key-minus-query distances) -> ``heads x ...`` additive attention bias."""

    def __init__(self, heads: int, bidirectional: bool, buckets: int = 32, max_distance: int = 128):
        super().__init__()
        self.bidirectional, self.buckets, self.max_distance = bidirectional, buckets, max_distance
        self.table = nn.Embedding(buckets, heads)

    def forward(self, relative: Tensor) -> Tensor:
        bucket = relative_position_bucket(relative, self.bidirectional, self.buckets, self.max_distance)
        return self.table(bucket).movedim(-1, 0)
