"""Recurrent (step) mode of a discrete SSM: ``x_k = dA x_{k-1} + dB u_k``, ``y_k = dC x_k + D u_k``.

A ``Recurrence`` is built by ``SSMKernel.recurrence(L)`` and holds the discrete matrices, so that
generating token after token does not recompute them. States are batched: ``B x H x N``.
"""
from __future__ import annotations

import abc

import torch
from torch import Tensor

from .fft_conv import check_input, fft_conv
from .structured_products import CHUNK_ELEMENTS, vandermonde


class Recurrence(abc.ABC):
    """Batched step mode of ``H`` SSM channels with ``C`` outputs each."""

    def __init__(self, D: Tensor):
        self.D = D  # C x H

    @property
    def channels(self) -> int:
        return self.D.shape[1]

    @abc.abstractmethod
    def initial_state(self, batch_size: int) -> Tensor:
        """The zero state, ``B x H x N``."""

    @abc.abstractmethod
    def step(self, u: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One step. ``u``: ``B x H``; returns ``y``: ``B x C x H`` and the next state."""

    def chunk(self, u: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """Steps over ``u``: ``B x H x L`` from ``state``; returns ``y``: ``B x C x H x L`` and the last state."""
        check_input(u, self.channels)
        ys = []
        for k in range(u.shape[-1]):
            y, state = self.step(u[..., k], state)
            ys.append(y)
        return torch.stack(ys, dim=-1), state

    def _check_step(self, u: Tensor, state: Tensor) -> None:
        if u.dim() != 2 or u.shape[1] != self.channels:
            raise ValueError(f"step input must have shape (batch, {self.channels}), got {tuple(u.shape)}")
        if state.shape[:2] != u.shape:
            raise ValueError(f"state of shape {tuple(state.shape)} does not match input {tuple(u.shape)}")


class DiagonalRecurrence(Recurrence):
    """Step mode of a diagonal SSM whose output is ``y_k = Re(sum_n dC_n x_{k,n}) + D u_k``.

    Args:
        dA: ``H x N`` diagonal of the discrete state matrix (complex, or real).
        dB: ``H x N``.
        dC: ``C x H x N``.
        D: ``C x H``.
    """

    def __init__(self, dA: Tensor, dB: Tensor, dC: Tensor, D: Tensor):
        super().__init__(D)
        self.dA, self.dB, self.dC = dA, dB, dC
        self.log_dA = torch.log(dA.to(torch.promote_types(dA.dtype, torch.complex64)))

    def initial_state(self, batch_size: int) -> Tensor:
        return self.dA.new_zeros((batch_size,) + tuple(self.dA.shape))

    def _output(self, state: Tensor, u: Tensor) -> Tensor:
        return torch.einsum("chn,bhn->bch", self.dC, state).real + self.D * u.unsqueeze(1)

    def step(self, u: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        self._check_step(u, state)
        state = self.dA * state + self.dB * u.unsqueeze(-1).to(self.dB.dtype)
        return self._output(state, u.to(self.D.dtype)), state

    def chunk(self, u: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """Parallel over time: FFT convolution plus the decaying response to ``state``, in bounded pieces."""
        check_input(u, self.channels)
        B, H, L = u.shape
        piece = max(1, CHUNK_ELEMENTS // max(1, B * self.dC.numel()))
        ys = []
        for uc in u.split(piece, dim=-1):
            y, state = self._chunk_parallel(uc.to(self.D.dtype), state)
            ys.append(y)
        return torch.cat(ys, dim=-1), state

    def _chunk_parallel(self, u: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        L = u.shape[-1]
        K = vandermonde(self.dC * self.dB, self.log_dA, L)  # C x H x L
        y = fft_conv(u, K, self.D)
        # response to the initial state: Re(sum_n dC_n dA_n^(k+1) x_n)
        y = y + vandermonde(self.dC * (self.dA * state).unsqueeze(1), self.log_dA, L)
        t = torch.arange(L - 1, -1, -1, dtype=u.dtype, device=u.device)
        powers = torch.exp(self.log_dA.unsqueeze(-1) * t)  # H x N x L: dA^(L-1-j)
        inputs = torch.einsum("bhl,hnl->bhn", u.to(powers.dtype), powers * self.dB.unsqueeze(-1))
        new_state = self.dA * powers[..., 0] * state + inputs
        if not state.is_complex():
            new_state = new_state.real
        return y, new_state


class DenseRecurrence(Recurrence):
    """Step mode from dense discrete matrices (used by S4, whose state matrix is not diagonal).

    Args:
        dA: ``H x N x N``; dB: ``H x N``; dC: ``C x H x N``; D: ``C x H``. The output is the real part.
    """

    def __init__(self, dA: Tensor, dB: Tensor, dC: Tensor, D: Tensor):
        super().__init__(D)
        self.dA, self.dB, self.dC = dA, dB, dC

    def initial_state(self, batch_size: int) -> Tensor:
        return self.dB.new_zeros((batch_size,) + tuple(self.dB.shape))

    def step(self, u: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        self._check_step(u, state)
        u = u.to(self.D.dtype)
        state = torch.einsum("hnm,bhm->bhn", self.dA, state) + self.dB * u.unsqueeze(-1)
        y = torch.einsum("chn,bhn->bch", self.dC, state).real + self.D * u.unsqueeze(1)
        return y, state
