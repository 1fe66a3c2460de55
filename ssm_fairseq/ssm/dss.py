"""Diagonal State Spaces (Gupta et al., 2022): DSS-exp and DSS-softmax.

With ``P_{n,k} = lambda_n dt k`` (Proposition 1)::

    DSS-exp:      K = Re(w~ . Lambda^-1 (exp(Lambda dt) - 1) . exp(P)),   Re(lambda) = -exp(.) < 0
    DSS-softmax:  K = Re(w . Lambda^-1 . row-softmax_eps(P)),             Lambda unrestricted

``row-softmax_eps`` is the corrected softmax of appendix A.2: subtract the entry of largest real part and
take ``reciprocal_eps(x) = conj(x) / (x conj(x) + eps)`` of the row sum, so it stays bounded even when
``Re(lambda) > 0``. The row sum is a geometric series and is summed in closed form. As discrete systems
(section 3.4) both are zero-order hold with ``B = 1`` (exp) or ``B = 1 / (exp(L lambda dt) - 1)`` (softmax,
here with the same eps correction as the kernel); the latter depends on ``L``, so the recurrence of
DSS-softmax is built for one length. With ``Re(lambda) > 0`` that recurrence grows like ``exp(Re(lambda) dt k)``
and is only usable for short ``L``; the convolution kernel stays bounded at any length.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .diagonal import DiagonalSSMKernel
from .hippo import DIAGONAL_INITS, diagonal_init
from .s4d import log_uniform_dt
from .structured_products import vandermonde

DSS_VARIANTS = ("exp", "softmax")


class DSSKernel(DiagonalSSMKernel):
    """DSS kernel: ``Lambda`` shared by all channels, ``w`` and ``dt`` per channel (DSS section 3.2).

    Args:
        channels: ``H``.
        state_size: number of complex eigenvalues ``N`` (the paper's N; the real state size is ``2N``).
        out_channels: ``C`` outputs per channel.
        variant: ``exp`` or ``softmax``.
        init: ``legs`` (Skew-HiPPO, the paper's choice), ``lin`` or ``random`` (raw parameters ~ N(0, 1)).
        softmax_eps: the ``eps`` of ``reciprocal_eps`` (appendix A.2).
    """

    discretization = "zoh"

    def __init__(
        self,
        channels: int,
        state_size: int = 64,
        out_channels: int = 1,
        variant: str = "softmax",
        init: str = "legs",
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        softmax_eps: float = 1e-7,
    ):
        super().__init__(channels, state_size, out_channels)
        if variant not in DSS_VARIANTS:
            raise ValueError(f"unknown DSS variant {variant!r}; expected one of {DSS_VARIANTS}")
        if init not in DIAGONAL_INITS:
            raise ValueError(f"unknown DSS init {init!r}; expected one of {DIAGONAL_INITS}")
        self.variant, self.softmax_eps = variant, softmax_eps
        N = state_size
        if init == "random":
            re, im = torch.randn(N), torch.randn(N)
        else:
            Lambda = diagonal_init(init, N)
            re = torch.log(-Lambda.real) if variant == "exp" else Lambda.real
            re, im = re.float(), Lambda.imag.float()
        self.Lambda_re = nn.Parameter(re)  # exp: log of -Re(Lambda); softmax: Re(Lambda)
        self.Lambda_im = nn.Parameter(im)
        self.W = nn.Parameter(torch.view_as_real(torch.randn(out_channels, channels, N, dtype=torch.complex64)).clone())
        self.D = nn.Parameter(torch.randn(out_channels, channels))
        self.log_dt = nn.Parameter(log_uniform_dt(channels, dt_min, dt_max).float())

    def prefix_stable(self) -> bool:
        return self.variant == "exp"  # DSS-softmax normalises over the kernel's length

    def eigenvalues(self) -> Tensor:
        re = self.real(self.Lambda_re)
        re = -torch.exp(re) if self.variant == "exp" else re
        return torch.complex(re, self.real(self.Lambda_im))

    def _softmax_normaliser(self, P_rate: Tensor, L: int) -> tuple[Tensor, Tensor]:
        """Row shift (position of the row maximum) and ``reciprocal_eps`` of the shifted row sum, ``H x N``."""
        growing = P_rate.real > 0
        shift = growing.to(P_rate.real.dtype) * (L - 1)  # k = L - 1 for growing rows, 0 for decaying ones
        s = torch.where(growing, -P_rate, P_rate)  # shifted row sum = sum_m exp(s m), Re(s) <= 0
        row_sum = torch.expm1(s * L) / torch.expm1(s)
        return shift, row_sum.conj() / (row_sum * row_sum.conj() + self.softmax_eps)

    def diagonal_system(self, L: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        Lambda = self.eigenvalues().unsqueeze(0)  # 1 x N
        dt = torch.exp(self.real(self.log_dt))
        if self.variant == "exp":
            return Lambda, torch.ones_like(Lambda), self.complex(self.W), dt
        # B such that the zero-order-hold kernel is the eps-corrected softmax kernel; with eps = 0 it is
        # the paper's 1 / (exp(L lambda dt) - 1).
        P_rate = Lambda * dt.unsqueeze(-1)
        shift, reciprocal = self._softmax_normaliser(P_rate, L)
        return Lambda, reciprocal * torch.exp(-P_rate * shift) / torch.expm1(P_rate), self.complex(self.W), dt

    def kernel(self, L: int) -> Tensor:
        if self.variant == "exp":
            return super().kernel(L)
        Lambda = self.eigenvalues()
        P_rate = Lambda * torch.exp(self.real(self.log_dt)).unsqueeze(-1)  # H x N: P_{n,k} = P_rate_n * k
        shift, reciprocal = self._softmax_normaliser(P_rate, L)
        return vandermonde(self.complex(self.W) / Lambda * reciprocal, P_rate, L, shift)
