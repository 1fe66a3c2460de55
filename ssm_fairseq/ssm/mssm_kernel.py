"""The MSSM kernel (MSSM paper, section 3.1): one tied, randomly initialised SSM per head.

Per head, all channels share the state matrix and the input vector (Eq. 7)::

    A = Lambda - p p^T,   Lambda = -exp(z),   z ~ N(ln(scale), 1),   B ~ N(0, 1)

while each channel has its own ``C`` (``out_channels`` rows), ``D`` and step ``dt = exp(z_dt)``; every
parameter but ``z`` is drawn from ``N(0, 1)``. Discretisation is bilinear (Eq. 2).

``A`` is real symmetric, so ``A = V diag(mu) V^T`` exactly (``torch.linalg.eigh``) and the kernel is the
real Vandermonde product ``K_k = sum_n (C V)_n dA_n^k (V^T B)_n dt / (1 - dt mu_n / 2)`` with
``dA_n = (1 + dt mu_n / 2) / (1 - dt mu_n / 2)``.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor, nn

from .diagonal import DiagonalSSMKernel
from .mssm_system import discrete_system, eigen_system, state_matrix
from .structured_products import real_vandermonde


class MSSMKernel(DiagonalSSMKernel):
    """Tied multi-head SSM kernel.

    Args:
        channels: ``H``, split evenly into ``heads`` (channel ``h`` belongs to head ``h // (H / heads)``).
        state_size: ``D_sh``, the state size of each head (32 in the paper).
        out_channels: output expansion ``C`` (1 for GELU, 2 for GLU or inter-head gating).
        heads: number of heads, each with its own ``Lambda``, ``p`` and ``B``.
        scale: ``z ~ N(ln(scale), 1)``; the paper leaves its value open, 0.5 matches S4D's ``Re(A) = -1/2``. A
            sequence gives each head its own (``heads`` values): a smaller scale means slower decay, a longer memory.
    """

    def __init__(self, channels: int, state_size: int = 32, out_channels: int = 1, heads: int = 1,
                 scale: float | Sequence[float] = 0.5):
        super().__init__(channels, state_size, out_channels)
        if heads < 1:
            raise ValueError(f"heads must be at least 1, got {heads}")
        if channels % heads:
            raise ValueError(f"channels ({channels}) must be a multiple of heads ({heads})")
        scales = [float(scale)] * heads if isinstance(scale, (int, float)) else [float(s) for s in scale]
        if len(scales) != heads or min(scales) <= 0:
            raise ValueError(f"scale must be positive, one value or one per head ({heads}), got {scale}")
        self.heads = heads
        log_scales = torch.tensor([math.log(s) for s in scales]).unsqueeze(-1)
        self.z_lambda = nn.Parameter(torch.randn(heads, state_size) + log_scales)
        self.p = nn.Parameter(torch.randn(heads, state_size))
        self.B = nn.Parameter(torch.randn(heads, state_size))
        self.C = nn.Parameter(torch.randn(out_channels, channels, state_size))
        self.D = nn.Parameter(torch.randn(out_channels, channels))
        self.z_dt = nn.Parameter(torch.randn(channels))

    def state_matrix(self) -> Tensor:
        """``A = diag(-exp(z)) - p p^T`` per head: ``heads x N x N``."""
        return state_matrix(self.real(self.z_lambda), self.real(self.p))

    def _per_channel(self, t: Tensor) -> Tensor:
        """Repeat a per-head tensor (``heads x ...``) for each channel of its head (``H x ...``)."""
        return t.repeat_interleave(self.channels // self.heads, dim=0)

    def diagonal_system(self, L: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        mu, _, b, c = eigen_system(*(self.real(t) for t in (self.z_lambda, self.p, self.B, self.C)))
        return self._per_channel(mu), self._per_channel(b), c, torch.exp(self.real(self.z_dt))

    def _parameters_in_order(self) -> list[Tensor]:
        """``z_lambda``, ``p``, ``B``, ``C``, ``z_dt`` in the compute dtype: what ``discrete_system`` reads."""
        return [self.real(t) for t in (self.z_lambda, self.p, self.B, self.C, self.z_dt)]

    def discrete_system(self, L: int) -> tuple[Tensor, Tensor, Tensor]:
        """``mssm_system.discrete_system`` of the parameters: one autograd node with its own backward pass."""
        return discrete_system(*self._parameters_in_order())

    def kernel(self, L: int) -> Tensor:
        return self.taps(*self._parameters_in_order(), L)

    @staticmethod
    def taps(z_lambda: Tensor, p: Tensor, B: Tensor, C: Tensor, z_dt: Tensor, L: int) -> Tensor:
        """The ``C x H x L`` kernel of these parameters (shapes as the attributes'; heads ``z_lambda.shape[0]``): what
        ``kernel(L)`` computes, and ``batched_kernels`` for several kernels' parameters concatenated."""
        dA, dB, dC = discrete_system(z_lambda, p, B, C, z_dt)
        return real_vandermonde(dC * dB, dA, L)

    def continuous_matrices(self, L: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        A = self._per_channel(self.state_matrix())
        B = self._per_channel(self.real(self.B))
        return A, B, self.real(self.C), torch.exp(self.real(self.z_dt))
