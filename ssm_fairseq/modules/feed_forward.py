"""The position-wise feed-forward block of transformer-style layers."""
from __future__ import annotations

from torch import Tensor, nn

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "swish": nn.SiLU}


def build_activation(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]()


class FeedForward(nn.Module):
    """``Linear(D, hidden) -> act -> dropout -> Linear(hidden, D)``: ``B x L x D -> B x L x D``."""

    def __init__(self, dim: int, hidden_dim: int, activation: str = "gelu", dropout: float = 0.0):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden_dim), build_activation(activation), nn.Dropout(dropout), nn.Linear(hidden_dim, dim)
        )

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        return self.net(x)

    def step(self, x: Tensor, cache: dict) -> Tensor:
        """The next frames of a stream (``B x n x D``): position-wise, so no state."""
        return self.net(x)
