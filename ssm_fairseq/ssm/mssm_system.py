"""The MSSM kernel's discrete system from its parameters, with its own backward pass.

Per head, ``A = -diag(exp(z)) - p p^T = V diag(mu) V^T`` (``eigh``), and per channel, with ``dt = exp(z_dt)``, ``h =
dt mu / 2`` and the bilinear rule (MSSM Eq. 2)::

    dA = (1 + h) / (1 - h),    dB = dt (V^T B) / (1 - h),    dC = C V

Its parameters change at every training step, so this runs in every step, forward and backward; as a composition of
autograd operators its backward pass dispatched 53 operators (each elementwise step's derivative one or two,
``eigh``'s about a dozen). Here it is one autograd node whose backward pass is written out (25 operators, the forward
pass 18; with ``r = 1 / (1 - h)`` and ``g_X`` the gradient of ``X``)::

    g_h    = r (2 r g_dA + dB g_dB)                         (dA' = 2 r^2, d dB / dh = dB r)
    g_mu   = sum over a head's channels of g_h dt / 2,     g_z_dt = (dt / 2) sum_n g_h mu + sum_n g_dB dB
    g_b    = sum over a head's channels of g_dB dt r,      g_B = V g_b,   g_C = g_dC V^T
    E      = V^T g_V = sum over outputs and channels of dC^T g_dC  +  b g_b^T           (b = V^T B)
    g_A    = V (diag(g_mu) + E / (mu_j - mu_i)) V^T          (eigh's backward pass, off the diagonal)
    g_z    = -diag(g_A) exp(z),                            g_p = -(g_A + g_A^T) p

(the last line is ``A``'s own derivative; ``g_A`` need not be symmetric, as ``A`` is built symmetric). Tested
against finite differences and against the autograd composition (``tests/test_mssm_system.py``).
"""
from __future__ import annotations

import torch
from torch import Tensor


def state_matrix(z_lambda: Tensor, p: Tensor) -> Tensor:
    """``A = diag(-exp(z)) - p p^T`` per head: ``heads x N`` parameters -> ``heads x N x N``."""
    return _state_matrix(torch.exp(z_lambda), p)


def _state_matrix(lam: Tensor, p: Tensor) -> Tensor:
    """``-diag(lam) - p p^T`` in one product (``baddbmm`` with both scales -1)."""
    return torch.baddbmm(torch.diag_embed(lam), p.unsqueeze(-1), p.unsqueeze(-2), beta=-1, alpha=-1)


def eigen_system(z_lambda: Tensor, p: Tensor, B: Tensor, C: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The continuous system in its eigenbasis: ``mu``: ``heads x N`` (ascending), ``V``: ``heads x N x N``,
    ``b = V^T B``: ``heads x N`` and ``c = C V``: ``C x H x N`` (``C``: ``C x H x N``, channel ``h`` in head ``h //
    (H / heads)``), differentiable by autograd."""
    mu, V, b, c, _ = _eigen_system(_state_matrix(torch.exp(z_lambda), p), B, C)
    return mu, V, b, c


def _eigen_system(A: Tensor, B: Tensor, C: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``eigen_system`` of ``A``, and ``V`` once for each output row and head (``(C heads) x N x N``: the right
    operand of ``C V`` as one batched product over all of a head's channels, kept for its backward pass)."""
    mu, V = torch.linalg.eigh(A)  # heads x N, heads x N x N
    heads, N = mu.shape
    b = torch.bmm(B.unsqueeze(1), V).view(heads, N)
    V_rows = V.expand(C.shape[0], heads, N, N).reshape(-1, N, N)
    c = torch.bmm(C.reshape(V_rows.shape[0], -1, N), V_rows).view(C.shape)
    return mu, V, b, c, V_rows


def discrete_system(z_lambda: Tensor, p: Tensor, B: Tensor, C: Tensor, z_dt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``dA``: ``H x N``, ``dB``: ``H x N`` and ``dC``: ``C x H x N`` of an MSSM kernel's parameters (real, one dtype):
    ``z_lambda``, ``p``, ``B``: ``heads x N``; ``C``: ``C x H x N``; ``z_dt``: ``H``. One autograd node."""
    return _DiscreteSystem.apply(z_lambda, p, B, C, z_dt)


class _DiscreteSystem(torch.autograd.Function):
    """``discrete_system``, its backward pass as in the module docstring."""

    @staticmethod
    def forward(ctx, z_lambda: Tensor, p: Tensor, B: Tensor, C: Tensor, z_dt: Tensor):
        heads, N = z_lambda.shape
        lam = torch.exp(z_lambda)
        mu, V, b, c, V_rows = _eigen_system(_state_matrix(lam, p), B, C)
        half_dt = torch.exp(z_dt).view(heads, -1, 1).mul_(0.5)  # heads x H/heads x 1
        h = half_dt * mu.unsqueeze(1)  # heads x H/heads x N
        # discretization.bilinear_diagonal's rule, written out so that r = 1 / (1 - h) is kept for the backward pass
        r = torch.reciprocal(1.0 - h)
        dA = (1.0 + h).mul_(r)
        dB = (half_dt * b.unsqueeze(1)).mul_(r).mul_(2.0)
        ctx.save_for_backward(lam, p, mu, V, V_rows, b, c, half_dt, r, dB)
        return dA.view(-1, N), dB.view(-1, N), c

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_dA: Tensor, g_dB: Tensor, g_dC: Tensor):
        lam, p, mu, V, V_rows, b, c, half_dt, r, dB = ctx.saved_tensors
        heads, N = mu.shape
        g_dA, g_dB = g_dA.view(r.shape), g_dB.view(r.shape)  # heads x H/heads x N
        dB_term = g_dB * dB
        g_h = torch.addcmul(dB_term, g_dA, r, value=2.0).mul_(r)
        half_dt_row = half_dt.transpose(1, 2)  # heads x 1 x H/heads
        g_mu = torch.bmm(half_dt_row, g_h)  # heads x 1 x N
        g_z_dt = torch.addcmul(dB_term.sum(-1, keepdim=True), half_dt, torch.bmm(g_h, mu.unsqueeze(-1)))
        g_b = torch.bmm(half_dt_row, g_dB * r).mul_(2.0)  # heads x 1 x N
        rows = V_rows.shape[0]  # C heads
        g_dC = g_dC.reshape(rows, -1, N)
        g_C = torch.bmm(g_dC, V_rows.transpose(1, 2)).view(c.shape)
        # E = V^T g_V: the products C V (through c = C V, V orthogonal) and V^T B (b g_b^T)
        E = torch.bmm(c.view(rows, -1, N).transpose(1, 2), g_dC)
        E = torch.baddbmm(E.view(-1, heads, N, N).sum(0), b.unsqueeze(-1), g_b)
        g_B = torch.bmm(V, g_b.transpose(1, 2)).view(heads, N)
        inner = E.div_(mu.unsqueeze(-2) - mu.unsqueeze(-1))  # E_ij / (mu_j - mu_i); the diagonal is replaced
        inner.diagonal(dim1=-2, dim2=-1).copy_(g_mu.view(heads, N))
        # the gradient of -A = diag(exp(z)) + p p^T: -V inner V^T (beta = 0: the first operand is not read)
        g_S = torch.baddbmm(inner, torch.bmm(V, inner), V.transpose(1, 2), beta=0, alpha=-1)
        g_z = g_S.diagonal(dim1=-2, dim2=-1) * lam
        g_p = torch.bmm(g_S + g_S.transpose(1, 2), p.unsqueeze(-1)).view(heads, N)
        return g_z, g_p, g_B, g_C, g_z_dt.view(-1)
