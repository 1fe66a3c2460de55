"""The Conformer convolution module (Gulati et al., 2020), as the MSSM paper's Conformer baseline uses it."""
from __future__ import annotations

from torch import Tensor, nn

from .dropout import LeanDropout


class ConformerConvolution(nn.Module):
    """Pointwise conv (D -> 2D), GLU, depthwise conv (kernel 31), BatchNorm, Swish, pointwise conv, dropout.

    ``B x L x D -> B x L x D``. Padded frames are zeroed before the depthwise convolution, so they never reach
    a real frame. BatchNorm uses batch statistics in training (padded frames included) and running statistics
    in evaluation, as in the reference Conformer.
    """

    def __init__(self, dim: int, kernel_size: int = 31, dropout: float = 0.0):
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"the depthwise kernel size must be odd, got {kernel_size}")
        self.pointwise_in = nn.Conv1d(dim, 2 * dim, 1)
        self.glu = nn.GLU(dim=1)
        self.depthwise = nn.Conv1d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)
        self.norm = nn.BatchNorm1d(dim)
        self.activation = nn.SiLU()
        self.pointwise_out = nn.Conv1d(dim, dim, 1)
        self.dropout = LeanDropout(dropout)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """``x``: ``B x L x D``; ``padding_mask``: ``B x L``, True at padded frames."""
        y = self.glu(self.pointwise_in(x.transpose(1, 2)))
        if padding_mask is not None:
            y = y.masked_fill(padding_mask.unsqueeze(1), 0.0)
        y = self.pointwise_out(self.activation(self.norm(self.depthwise(y))))
        return self.dropout(y).transpose(1, 2)
