"""Discretisation of ``x' = A x + B u`` with step ``dt``: bilinear (Tustin) and zero-order hold.

Bilinear (MSSM Eq. 2, SPADE Eq. 3)::

    dA = (I - dt A / 2)^-1 (I + dt A / 2),    dB = (I - dt A / 2)^-1 dt B

Zero-order hold (S4D, DSS section 3.4)::

    dA = exp(dt A),    dB = A^-1 (exp(dt A) - I) B

The ``*_diagonal`` forms act on the eigenvalues of a diagonal ``A`` elementwise; the ``*_dense`` forms are
the textbook matrix formulas, used to build the dense matrices that tests compare kernels against.
``bilinear_low_rank`` discretises S4's diagonal-plus-low-rank ``A`` without forming it, for its step mode.
"""
from __future__ import annotations

import torch
from torch import Tensor

METHODS = ("bilinear", "zoh")


def bilinear_diagonal(a: Tensor, b: Tensor, dt: Tensor) -> tuple[Tensor, Tensor]:
    """Elementwise bilinear rule. ``a``, ``b``, ``dt`` broadcast (e.g. ``H x N``, ``H x N``, ``H x 1``)."""
    half_step = dt * a / 2
    den = 1.0 - half_step
    return (1.0 + half_step) / den, dt * b / den


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


def bilinear_low_rank(Lambda: Tensor, P: Tensor, B: Tensor, dt: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The bilinear rule for ``A = diag(Lambda) - P P^*`` (S4's DPLR form) in ``O(N)`` per channel, as a diagonal
    plus rank-two ``dA x = g x + U_0 (V_0 . x) + U_1 (V_1 . x)``.

    With ``h = dt / 2`` and ``d = 1 / (1 - h Lambda)``, ``M = I - h A = diag(1 / d) + h P P^*`` and Woodbury gives
    ``M^-1 y = d y - c (P^* d y)``, ``c = h d P / (1 + h P^* d P)``. Then
    ``dA x = M^-1 ((1 + h Lambda) x) - (P^* x) M^-1 (h P) = g x - c ((P^* g) . x) - (M^-1 h P) (P^* . x)``
    with ``g = d (1 + h Lambda)``, and ``dB = M^-1 (dt B)``.

    Args:
        Lambda, P: ``N`` (or ``H x N``); B: ``N`` or ``H x N``; dt: ``H``.
    Returns:
        ``g``: ``H x N``, ``U`` and ``V``: ``2 x H x N``, ``dB``: ``H x N``.
    """
    h = (dt / 2).unsqueeze(-1).to(Lambda.dtype)  # H x 1
    d = 1 / (1 - h * Lambda)
    P_conj = P.conj()
    c = h * d * P / (1 + (h * P_conj * d * P).sum(-1, keepdim=True))  # H x N

    def solve(y: Tensor) -> Tensor:  # M^-1 y
        dy = d * y
        return dy - c * (P_conj * dy).sum(-1, keepdim=True)

    g = d * (1 + h * Lambda)
    U = torch.stack([-c, -solve(h * P)])  # 2 x H x N
    V = torch.stack([P_conj * g, P_conj.expand_as(g)])
    return g, U, V, solve(2 * h * B)
