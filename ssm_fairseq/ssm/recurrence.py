"""Recurrent (step) mode of a discrete SSM: ``x_k = dA x_{k-1} + dB u_k``, ``y_k = dC x_k + D u_k``.

A ``Recurrence`` is built by ``SSMKernel.recurrence(L)`` and holds the discrete matrices, so that
generating token after token does not recompute them. States are batched: ``B x H x N``.
"""
from __future__ import annotations

import abc

import torch
from torch import Tensor

from .fft_conv import check_input, fft_conv
from .structured_products import CHUNK_ELEMENTS, real_vandermonde, vandermonde


DIRECT_CHUNK = 64  # pieces up to this many steps multiply by the Toeplitz matrix: an FFT of a few taps costs more


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
        if u.shape[-1] == 1:  # a generated token: no stacking
            y, state = self.step(u[..., 0], state)
            return y.unsqueeze(-1), state
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
        self._pieces: dict[int, tuple[Tensor, Tensor]] = {}  # piece length -> its matrices (_piece_matrices)

    def initial_state(self, batch_size: int) -> Tensor:
        return self.dA.new_zeros((batch_size,) + tuple(self.dA.shape))

    def _output(self, state: Tensor, u: Tensor) -> Tensor:
        return torch.einsum("chn,bhn->bch", self.dC, state).real + self.D * u.unsqueeze(1)

    def step(self, u: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        self._check_step(u, state)
        state = self.dA * state + self.dB * u.unsqueeze(-1).to(self.dB.dtype)
        return self._output(state, u.to(self.D.dtype)), state

    def chunk(self, u: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """Parallel over time: the convolution plus the decaying response to ``state``, in bounded pieces.

        Pieces of at most ``DIRECT_CHUNK`` steps (a stream's chunks) multiply by the lower-triangular Toeplitz
        matrix of the kernel; longer ones use the FFT. Without autograd the matrices of each piece length are kept
        with the recurrence, so a stream of equal chunks computes them once.
        """
        check_input(u, self.channels)
        B, H, L = u.shape
        piece = max(1, CHUNK_ELEMENTS // max(1, B * self.dC.numel()))
        ys = []
        for uc in u.split(piece, dim=-1):
            y, state = self._chunk_parallel(uc.to(self.D.dtype), state)
            ys.append(y)
        return torch.cat(ys, dim=-1), state

    def _piece_matrices(self, L: int) -> tuple[Tensor, Tensor]:
        """For pieces of ``L`` steps: the kernel (``C x H x L``; as a ``C x H x L x L`` Toeplitz matrix up to
        ``DIRECT_CHUNK`` steps) and the powers ``dA^t``, ``t < L``: ``H x N x L`` (real for a real ``dA``, with
        ``0^0 = 1``). Kept per length without autograd only (with it, each call builds its own graph)."""
        caching = not torch.is_grad_enabled()
        if caching and L in self._pieces:
            return self._pieces[L]
        t = torch.arange(L, device=self.dA.device)
        if self.dA.is_complex():
            K = vandermonde(self.dC * self.dB, self.log_dA, L)
            powers = torch.exp(self.log_dA.unsqueeze(-1) * t.to(self.dA.real.dtype))
        else:  # the arithmetic of the real kernels' convolution mode (MSSM), exact at a zero base
            K = real_vandermonde(self.dC * self.dB, self.dA, L)
            powers = self.dA.unsqueeze(-1) ** t.to(self.dA.dtype)
        if L <= DIRECT_CHUNK:
            lag = t.unsqueeze(1) - t  # k - j
            K = K[..., lag.clamp(min=0)] * (lag >= 0).to(K.dtype)
        if caching:
            if len(self._pieces) >= 8:  # a few lengths recur in a stream (its chunks and its last one)
                self._pieces.clear()
            self._pieces[L] = K, powers
        return K, powers

    def _chunk_parallel(self, u: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        L = u.shape[-1]
        K, powers = self._piece_matrices(L)
        if K.dim() == 4:  # y_k = sum_{j<=k} K_{k-j} u_j + D u_k
            y = torch.einsum("chkj,bhj->bchk", K, u) + self.D.unsqueeze(-1) * u.unsqueeze(1)
        else:
            y = fft_conv(u, K, self.D)
        # response to the initial state: Re(sum_n dC_n dA_n^(k+1) x_n)
        y = y + torch.einsum("chn,bhn,hnl->bchl", self.dC, self.dA * state, powers).real
        # the last state: dA^L x + sum_j dA^(L-1-j) dB u_j
        inputs = torch.einsum("bhl,hnl->bhn", u.to(powers.dtype), powers.flip(-1) * self.dB.unsqueeze(-1))
        new_state = self.dA * powers[..., -1] * state + inputs
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


class LowRankRecurrence(Recurrence):
    """Step mode of a system whose discrete state matrix is diagonal plus low rank,
    ``dA x = g x + sum_k U_k (V_k . x)``: ``O(H N r)`` per step instead of the dense ``O(H N^2)``.

    S4's ``A = diag(Lambda) - P P^*`` under the bilinear rule is such a system with rank 2 (``bilinear_low_rank``).

    Args:
        g: ``H x N`` diagonal; U, V: ``r x H x N``; dB: ``H x N``; dC: ``C x H x N``; D: ``C x H``. The output is
        the real part of ``dC x``.
    """

    def __init__(self, g: Tensor, U: Tensor, V: Tensor, dB: Tensor, dC: Tensor, D: Tensor):
        super().__init__(D)
        # vecdot conjugates its first argument: keep conj(V), conj(dC) so that vecdot gives V . x, dC . x
        self.g, self.U, self.V_conj, self.dB, self.dC_conj = g, U, V.conj().resolve_conj(), dB, dC.conj().resolve_conj()

    def initial_state(self, batch_size: int) -> Tensor:
        return self.dB.new_zeros((batch_size,) + tuple(self.dB.shape))

    def step(self, u: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        self._check_step(u, state)
        u = u.to(self.D.dtype)
        new_state = self.g * state + self.dB * u.unsqueeze(-1)
        for U, V_conj in zip(self.U, self.V_conj):  # elementwise products: batched complex GEMVs this small are slower
            new_state = new_state + U * torch.linalg.vecdot(V_conj, state).unsqueeze(-1)
        y = torch.linalg.vecdot(self.dC_conj, new_state.unsqueeze(1)).real + self.D * u.unsqueeze(1)
        return y, new_state


class ConjugatePairRecurrence(LowRankRecurrence):
    """``LowRankRecurrence`` of a system whose states come in conjugate pairs (state ``n + N/2`` is the conjugate of
    state ``n`` in ``g``, ``U``, ``V``, ``dB`` and ``dC``), driven by real inputs, as S4's is: from the zero state the
    second half of the state stays the conjugate of the first, so only the first half is kept and stepped, half the
    work of the full state. A sum over both halves is twice the real part of the sum over one:
    ``V . x = 2 Re(V_half . x_half)``, and so is the output.

    Args: the full system, as for ``LowRankRecurrence`` (``N`` even); the first half of each is kept. States are
    ``B x H x N/2``.
    """

    def __init__(self, g: Tensor, U: Tensor, V: Tensor, dB: Tensor, dC: Tensor, D: Tensor):
        half = g.shape[-1] // 2
        super().__init__(g[..., :half], U[..., :half], V[..., :half], dB[..., :half], dC[..., :half], D)

    def step(self, u: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        self._check_step(u, state)
        u = u.to(self.D.dtype)
        coupling = 2 * torch.linalg.vecdot(self.V_conj, state.unsqueeze(1)).real  # B x r x H: V_k . x, real
        new_state = torch.addcmul(self.g * state, self.dB, u.unsqueeze(-1)) + (self.U * coupling.unsqueeze(-1)).sum(1)
        y = 2 * torch.linalg.vecdot(self.dC_conj, new_state.unsqueeze(1)).real + self.D * u.unsqueeze(1)
        return y, new_state
