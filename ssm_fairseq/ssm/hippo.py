"""HiPPO matrices and the initialisations of diagonal state spaces.

HiPPO-LegS in normal plus low-rank form follows the SPADE paper, Eq. 5::

    A = A_N - P P^T,   B_i = (2i + 1)^(1/2),   P_i = (i + 1/2)^(1/2),
    (A_N)_ij = -(i + 1/2)^(1/2) (j + 1/2)^(1/2)  for i > j,
             = -1/2                                for i = j,
             = +(i + 1/2)^(1/2) (j + 1/2)^(1/2)    for i < j.

``A_N`` is ``-I/2`` plus a skew-symmetric matrix, hence normal, and its eigenvalues are
``-1/2 + i theta`` in conjugate pairs. Those with a positive imaginary part are the
"Skew-HiPPO" initialisation of the DSS paper (section 3.3) and of S4D-LegS.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

DIAGONAL_INITS = ("legs", "lin", "random")


def legs_normal_part(N: int) -> Tensor:
    """The normal part ``A_N`` of HiPPO-LegS (SPADE Eq. 5), ``N x N`` float64."""
    q = torch.sqrt(torch.arange(N, dtype=torch.float64) + 0.5)
    outer = q[:, None] * q[None, :]
    return -torch.tril(outer, -1) + torch.triu(outer, 1) - 0.5 * torch.eye(N, dtype=torch.float64)


def legs_matrices(N: int) -> tuple[Tensor, Tensor, Tensor]:
    """HiPPO-LegS ``(A, B, P)`` with ``A = A_N - P P^T``: shapes ``N x N``, ``N``, ``N`` (float64)."""
    n = torch.arange(N, dtype=torch.float64)
    P = torch.sqrt(n + 0.5)
    B = torch.sqrt(2 * n + 1)
    A = legs_normal_part(N) - P[:, None] * P[None, :]
    return A, B, P


class NPLR(NamedTuple):
    """HiPPO-LegS in the eigenbasis of its normal part, keeping one state of each conjugate pair.

    With ``V`` the ``N x N/2`` eigenvectors (``A_N V = V diag(Lambda)``), the full system is
    ``[V, conj V]`` applied to ``[Lambda, conj Lambda]``; ``P`` and ``B`` are ``V^* P`` and ``V^* B``.
    """

    Lambda: Tensor  # N/2, complex128
    P: Tensor  # N/2, complex128
    B: Tensor  # N/2, complex128
    V: Tensor  # N x N/2, complex128


def legs_nplr(N: int) -> NPLR:
    """Diagonalise the normal part of HiPPO-LegS and keep the eigenvalues with positive imaginary part."""
    if N < 2 or N % 2:
        raise ValueError(f"the S4 state size must be even and >= 2, got {N}")
    _, B, P = legs_matrices(N)
    skew = legs_normal_part(N) + 0.5 * torch.eye(N, dtype=torch.float64)
    # skew = V (i theta) V^*  <=>  -i * skew is Hermitian with eigenvalues theta.
    theta, V = torch.linalg.eigh(-1j * skew.to(torch.complex128))
    keep = torch.argsort(theta, descending=True)[: N // 2]
    theta, V = theta[keep], V[:, keep]
    if (theta <= 0).any():
        raise ValueError(f"HiPPO-LegS normal part of size {N} has a zero eigenvalue; use another N")
    Lambda = -0.5 + 1j * theta.to(torch.complex128)
    Vh = V.conj().T
    return NPLR(Lambda, Vh @ P.to(V.dtype), Vh @ B.to(V.dtype), V)


def diagonal_init(kind: str, N: int) -> Tensor:
    """Initial eigenvalues ``Lambda`` (``N`` complex128, positive imaginary parts) of a diagonal SSM.

    ``legs``: Skew-HiPPO, the eigenvalues of the ``2N x 2N`` LegS normal part (DSS section 3.3).
    ``lin``: S4D-Lin, ``-1/2 + i pi n``.
    ``random`` is sampled by each kernel on its own raw parameters, so it has no fixed value here.
    """
    if kind == "legs":
        return legs_nplr(2 * N).Lambda
    if kind == "lin":
        return torch.complex(torch.full((N,), -0.5, dtype=torch.float64), math.pi * torch.arange(N, dtype=torch.float64))
    raise ValueError(f"unknown diagonal initialisation {kind!r}; expected one of {DIAGONAL_INITS}")
