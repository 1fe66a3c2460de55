"""S4D: a diagonal SSM with zero-order hold and a Vandermonde kernel (Gu et al., 2022, "On the
parameterization and initialization of diagonal state space models")::

    A_n = -exp(log_neg_real_n) + i imag_n,   dA = exp(dt A),   dB = (exp(dt A) - 1) / A * B,
    K_k = 2 Re(sum_n C_n dA_n^k dB_n)        (N/2 stored states, one of each conjugate pair)
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .diagonal import DiagonalSSMKernel
from .hippo import DIAGONAL_INITS, diagonal_init


def log_uniform_dt(channels: int, dt_min: float, dt_max: float) -> Tensor:
    """``log dt`` sampled uniformly in ``[log dt_min, log dt_max]`` (S4, S4D, DSS), ``H``."""
    return torch.rand(channels, dtype=torch.float64) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)


class S4DKernel(DiagonalSSMKernel):
    """S4D kernel with per-channel eigenvalues.

    Args:
        channels: ``H``.
        state_size: real state size ``N`` (``N/2`` complex states are stored).
        out_channels: ``C`` outputs per channel.
        init: ``legs`` (Skew-HiPPO / S4D-LegS), ``lin`` (S4D-Lin) or ``random`` (raw parameters ~ N(0, 1)).
        dt_min, dt_max: range of the log-uniform initial step.
    """

    discretization = "zoh"

    def __init__(
        self,
        channels: int,
        state_size: int = 64,
        out_channels: int = 1,
        init: str = "legs",
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
    ):
        super().__init__(channels, state_size, out_channels)
        if state_size % 2:
            raise ValueError(f"S4D state_size must be even (conjugate pairs), got {state_size}")
        if init not in DIAGONAL_INITS:
            raise ValueError(f"unknown S4D init {init!r}; expected one of {DIAGONAL_INITS}")
        H, N = channels, state_size // 2
        if init == "random":
            log_neg_real, imag = torch.randn(H, N), torch.randn(H, N)
        else:
            Lambda = diagonal_init(init, N)
            log_neg_real = torch.log(-Lambda.real).float().expand(H, N).clone()
            imag = Lambda.imag.float().expand(H, N).clone()
        self.log_neg_real = nn.Parameter(log_neg_real)
        self.imag = nn.Parameter(imag)
        self.B = nn.Parameter(torch.view_as_real(torch.ones(H, N, dtype=torch.complex64)).clone())
        self.C = nn.Parameter(torch.view_as_real(torch.randn(out_channels, H, N, dtype=torch.complex64)).clone())
        self.D = nn.Parameter(torch.randn(out_channels, H))
        self.log_dt = nn.Parameter(log_uniform_dt(H, dt_min, dt_max).float())

    def diagonal_system(self, L: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        a = torch.complex(-torch.exp(self.real(self.log_neg_real)), self.real(self.imag))
        return a, self.complex(self.B), 2 * self.complex(self.C), torch.exp(self.real(self.log_dt))
