"""Shared machinery of kernels whose state matrix is diagonal (S4D, DSS, and MSSM after ``eigh``).

A diagonal system with eigenvalues ``a_n`` has the kernel ``K_k = Re(sum_n dC_n dA_n^k dB_n)``: a Vandermonde
product, computed in ``O(H N L)`` time and ``O(H (N + L))`` memory by ``structured_products.vandermonde``.
"""
from __future__ import annotations

import abc

import torch
from torch import Tensor

from .chunked_conv import ChunkMatrices, DiagonalSystem, chunk_matrices
from .discretization import bilinear_diagonal, zoh_diagonal
from .inference_cache import kept
from .kernel import SSMKernel
from .recurrence import DiagonalRecurrence
from .structured_products import vandermonde


class DiagonalSSMKernel(SSMKernel):
    """An SSM kernel defined by diagonal continuous matrices and a discretisation rule."""

    @abc.abstractmethod
    def diagonal_system(self, L: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Eigenvalues ``a``: ``H x N``, ``b``: ``H x N``, ``c``: ``C x H x N`` and ``dt``: ``H``.

        The system's output is ``Re(sum_n c_n x_n)``; complex systems hold one state of each conjugate pair
        and fold the factor 2 into ``c`` where the paper does.
        """

    def discrete_system(self, L: int) -> tuple[Tensor, Tensor, Tensor]:
        """``dA``: ``H x N``, ``dB``: ``H x N`` and ``dC``: ``C x H x N``."""
        a, b, c, dt = self.diagonal_system(L)
        rule = bilinear_diagonal if self.discretization == "bilinear" else zoh_diagonal
        dA, dB = rule(a, b, dt.unsqueeze(-1))
        return dA, dB, c

    def kernel(self, L: int) -> Tensor:
        dA, dB, dC = self.discrete_system(L)  # complex (S4D, DSS); MSSM's real system has its own ``kernel``
        log_dA = torch.log(dA.to(torch.promote_types(dA.dtype, torch.complex64)))
        return vandermonde(dC * dB, log_dA, L)

    def chunkable_system(self, L: int) -> DiagonalSystem | None:
        """The discrete system that ``chunked_diagonal_conv`` convolves with, in place of ``forward(L)``'s kernel, or
        None where ``dA`` is complex (S4D, DSS): MSSM's real eigenvalues only."""
        self.check_length(L)
        with torch.autocast(device_type=self.D.device.type, enabled=False):
            dA, dB, dC = self.discrete_system(L)
            return None if dA.is_complex() else DiagonalSystem(dA, dB, dC, self.real(self.D))

    def chunk_matrices(self, L: int, T: int, reverse: bool, dtype: torch.dtype) -> ChunkMatrices:
        """``chunked_conv.chunk_matrices`` of ``chunkable_system(L)`` for chunks of ``T`` positions, in ``dtype``; in
        inference kept until a parameter changes (``inference_cache.kept``: one set, for the last ``T``)."""

        def compute() -> ChunkMatrices:
            system = self.chunkable_system(L)
            if system is None:
                raise ValueError(f"{type(self).__name__} has complex eigenvalues: it cannot be convolved chunk by chunk")
            with torch.autocast(device_type=self.D.device.type, enabled=False):
                return chunk_matrices(system, T, reverse, dtype)

        return kept(self, "chunk matrices", list(self.parameters()), compute, (T, reverse, dtype))

    def recurrence(self, L: int) -> DiagonalRecurrence:
        self.check_length(L)
        with torch.autocast(device_type=self.D.device.type, enabled=False):
            return DiagonalRecurrence(*self.discrete_system(L), self.real(self.D))

    def continuous_matrices(self, L: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        a, b, c, dt = self.diagonal_system(L)
        H = self.channels
        a, b = a.expand(H, -1), b.expand(H, -1)
        if a.is_complex():  # expand to conjugate pairs: Re(c x) = (c/2) x + conj(c/2) conj(x)
            a, b = torch.cat([a, a.conj()], -1), torch.cat([b, b.conj()], -1)
            c = torch.cat([c, c.conj()], -1) / 2
        return torch.diag_embed(a), b, c, dt
