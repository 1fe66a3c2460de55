"""S4 with HiPPO-LegS (Gu et al., 2022; SPADE section 2.2, Eq. 5).

The state matrix is diagonal plus low rank in the eigenbasis of the LegS normal part (``hippo.legs_nplr``),
``A = Lambda - P P^*``, discretised with the bilinear rule. Only one state of each conjugate pair is stored.

The kernel is evaluated through its truncated generating function at the ``l_max``-th roots of unity
``z_j``. With ``s = 1 - z`` and ``t = 1 + z``, the bilinear rule gives::

    K^(z) = C~ (I - dA z)^-1 dB = 2 C~ ((2/dt) s I - t A)^-1 B,        C~ = C (I - dA^l_max)

and with ``A = Lambda - P P^*`` the Woodbury identity reduces the inverse to four Cauchy sums
``k_xy = sum_n x_n y_n / (g - lambda_n)``, ``g = (2/dt) s / t``::

    K^(z) = (2 / t) (k(C~, B) - k(C~, P) k(P^*, B) / (1 + k(P^*, P)))

At ``z = -1`` (``t = 0``) the low-rank term vanishes and ``K^ = dt Re(sum_n C~_n B_n)`` (both halves).
``K = irfft(K^)`` then gives ``l_max`` taps; shorter kernels are its prefix. As in the S4 reference, the
trainable output vector is ``C~``; ``continuous_matrices`` returns the true ``C = C~ (I - dA^l_max)^-1``.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .discretization import bilinear_dense, bilinear_low_rank
from .hippo import legs_nplr
from .kernel import SSMKernel
from .recurrence import ConjugatePairRecurrence
from .s4d import log_uniform_dt
from .structured_products import cauchy


class S4Kernel(SSMKernel):
    """S4-LegS kernel; ``A`` and ``B`` are shared by the channels, ``C~``, ``D`` and ``dt`` are per channel.

    Args:
        channels: ``H``.
        state_size: real state size ``N`` (even; ``N/2`` complex states are stored).
        out_channels: ``C`` outputs per channel.
        l_max: the longest kernel; ``forward(L)`` with ``L > l_max`` raises ``ValueError``.
        trainable_A, trainable_B, trainable_dt: False freezes them (SPADE freezes A and B).
    """

    def __init__(
        self,
        channels: int,
        state_size: int = 64,
        out_channels: int = 1,
        l_max: int = 4096,
        trainable_A: bool = True,
        trainable_B: bool = True,
        trainable_dt: bool = True,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
    ):
        super().__init__(channels, state_size, out_channels)
        if l_max < 1:
            raise ValueError(f"l_max must be positive, got {l_max}")
        self.l_max = l_max
        nplr = legs_nplr(state_size)
        half = state_size // 2

        def register(name: str, value: Tensor, trainable: bool) -> None:
            value = value.float().contiguous()
            if trainable:
                self.register_parameter(name, nn.Parameter(value))
            else:
                self.register_buffer(name, value)

        register("log_neg_real", torch.log(-nplr.Lambda.real), trainable_A)
        register("imag", nplr.Lambda.imag, trainable_A)
        register("P", torch.view_as_real(nplr.P), trainable_A)
        register("B", torch.view_as_real(nplr.B), trainable_B)
        register("log_dt", log_uniform_dt(channels, dt_min, dt_max), trainable_dt)
        C = torch.randn(out_channels, channels, half, dtype=torch.complex64) * math.sqrt(0.5)
        self.C = nn.Parameter(torch.view_as_real(C).clone())
        self.D = nn.Parameter(torch.randn(out_channels, channels))

    def check_length(self, L: int) -> None:
        super().check_length(L)
        if L > self.l_max:
            raise ValueError(
                f"sequence length {L} exceeds the S4 kernel's l_max={self.l_max}; build it with a larger l_max"
            )

    def _system(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        Lambda = torch.complex(-torch.exp(self.real(self.log_neg_real)), self.real(self.imag))
        dt = torch.exp(self.real(self.log_dt))
        return Lambda, self.complex(self.P), self.complex(self.B), self.complex(self.C), dt

    def kernel(self, L: int) -> Tensor:
        Lambda, P, B, C, dt = self._system()
        n_freq = self.l_max // 2 + 1
        nyquist = self.l_max % 2 == 0
        j = torch.arange(n_freq - int(nyquist), dtype=dt.dtype, device=dt.device)
        z = torch.exp(torch.complex(torch.zeros_like(j), -2 * math.pi * j / self.l_max))  # F
        g = (2.0 / dt).unsqueeze(-1) * ((1 - z) / (1 + z))  # H x F
        Pc = P.conj()
        # numerators of the four Cauchy sums: k(C~,B), k(C~,P), k(P*,B), k(P*,P)
        v = torch.cat([C * B, C * P, (Pc * B).expand_as(C[:1]), (Pc * P).expand_as(C[:1])])
        r = cauchy(torch.cat([v, v.conj()], -1), g, torch.cat([Lambda, Lambda.conj()]))  # (2C+2) x H x F
        k00, k01, k10, k11 = r[: self.out_channels], r[self.out_channels : -2], r[-2], r[-1]
        spectrum = (2 / (1 + z)) * (k00 - k01 * k10 / (1 + k11))
        if nyquist:
            at_minus_one = dt * (C * B).sum(-1).real  # C x H
            spectrum = torch.cat([spectrum, at_minus_one.unsqueeze(-1).to(spectrum.dtype)], -1)
        return torch.fft.irfft(spectrum, n=self.l_max)[..., :L]

    def _full_system(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``Lambda``, ``P``, ``B``, ``C~`` with both states of each conjugate pair (``N``, ``N``, ``N``,
        ``C x H x N``) and ``dt`` (``H``)."""
        full = lambda x: torch.cat([x, x.conj()], -1)  # noqa: E731
        Lambda, P, B, C_tilde, dt = self._system()
        return full(Lambda), full(P), full(B), full(C_tilde), dt

    def _true_C(self, A: Tensor, B: Tensor, C_tilde: Tensor, dt: Tensor) -> Tensor:
        """``C = C~ (I - dA^l_max)^-1`` from the dense ``A`` (``H x N x N``): ``C x H x N``."""
        dA = bilinear_dense(A, B, dt)[0]
        M = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device) - torch.linalg.matrix_power(dA, self.l_max)
        return torch.linalg.solve(M.transpose(-1, -2), C_tilde.unsqueeze(-1)).squeeze(-1)

    def continuous_matrices(self, L: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Dense matrices of the full (both halves) complex system; ``C`` is the true output matrix."""
        Lambda, P, B, C_tilde, dt = self._full_system()
        A = (torch.diag(Lambda) - P.unsqueeze(-1) * P.conj().unsqueeze(-2)).expand(self.channels, -1, -1)
        B = B.expand(self.channels, -1)
        return A, B, self._true_C(A, B, C_tilde, dt), dt

    def recurrence(self, L: int) -> ConjugatePairRecurrence:
        """Step mode in ``O(H N)`` per step (diagonal plus rank two, ``bilinear_low_rank``), stepping one state of
        each conjugate pair, valid for any ``L <= l_max``."""
        self.check_length(L)
        with torch.autocast(device_type=self.D.device.type, enabled=False):
            A, B, C, dt = self.continuous_matrices(L)
            Lambda, P = self._full_system()[:2]
            return ConjugatePairRecurrence(*bilinear_low_rank(Lambda, P, B, dt), C, self.real(self.D))
