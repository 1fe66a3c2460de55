"""Discretisation of ``x' = A x + B u`` with step ``dt``: bilinear (Tustin) and zero-order hold.

Bilinear (MSSM Eq. 2, SPADE Eq. 3)::

    dA = (I - dt A / 2)^-1 (I + dt A / 2),    dB = (I - dt A / 2)^-1 dt B

Zero-order hold (S4D, DSS section 3.4)::

    dA = exp(dt A),    dB = A^-1 (exp(dt A) - I) B

The ``*_diagonal`` forms act on the eigenvalues of a diagonal ``A`` elementwise; the ``*_dense`` forms are
the textbook matrix formulas, used to build the dense matrices that tests compare kernels against.
"""
from __future__ import annotations

import torch
from torch import Tensor

METHODS = ("bilinear", "zoh")


def bilinear_diagonal(a: Tensor, b: Tensor, dt: Tensor) -> tuple[Tensor, Tensor]:
    """Elementwise bilinear rule. ``a``, ``b``, ``dt`` broadcast (e.g. ``H x N``, ``H x N``, ``H x 1``)."""
    den = 1.0 - dt * a / 2
    return (1.0 + dt * a / 2) / den, dt * b / den


def zoh_diagonal(a: Tensor, b: Tensor, dt: Tensor) -> tuple[Tensor, Tensor]:
    """Elementwise zero-order hold, ``dA = exp(dt a)``, ``dB = (exp(dt a) - 1) / a * b``."""
    return torch.exp(dt * a), torch.expm1(dt * a) / a * b


def bilinear_dense(A: Tensor, B: Tensor, dt: Tensor) -> tuple[Tensor, Tensor]:
    """``A``: ``H x N x N``, ``B``: ``H x N``, ``dt``: ``H`` -> ``dA``: ``H x N x N``, ``dB``: ``H x N``."""
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    half = dt.to(A.dtype)[:, None, None] / 2 * A
    dA = torch.linalg.solve(eye - half, eye + half)
    dB = torch.linalg.solve(eye - half, dt.to(A.dtype)[:, None] * B.to(A.dtype))
    return dA, dB


def zoh_dense(A: Tensor, B: Tensor, dt: Tensor) -> tuple[Tensor, Tensor]:
    """Matrix exponential form of zero-order hold; shapes as in ``bilinear_dense``."""
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    dA = torch.linalg.matrix_exp(dt.to(A.dtype)[:, None, None] * A)
    dB = torch.linalg.solve(A, ((dA - eye) @ B.to(A.dtype).unsqueeze(-1))).squeeze(-1)
    return dA, dB


def discretize_dense(method: str, A: Tensor, B: Tensor, dt: Tensor) -> tuple[Tensor, Tensor]:
    """Dispatch to ``bilinear_dense`` or ``zoh_dense``."""
    if method == "bilinear":
        return bilinear_dense(A, B, dt)
    if method == "zoh":
        return zoh_dense(A, B, dt)
    raise ValueError(f"unknown discretisation {method!r}; expected one of {METHODS}")
