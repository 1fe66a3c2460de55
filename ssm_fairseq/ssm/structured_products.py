"""Memory-bounded Cauchy and Vandermonde products, the two sums that SSM kernels reduce to.

Both are ``sum_n`` over the state dimension of an ``N x L`` structured matrix. Written naively, autograd
keeps the whole ``... x N x L`` matrix for the backward pass; these functions instead walk over ``L`` in
chunks in the forward *and* the backward pass, so peak memory is ``O(... x (N + L))`` plus one chunk.
"""
from __future__ import annotations

import torch
from torch import Tensor

# Elements of one chunk of the structured matrix (complex128 at this size is 64 MiB).
CHUNK_ELEMENTS = 1 << 22


def _chunk_length(batch_shape: torch.Size, N: int, L: int) -> int:
    per_position = max(1, batch_shape.numel() * N)
    return max(1, min(L, CHUNK_ELEMENTS // per_position))


class _Cauchy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v: Tensor, z: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(v, z, w)
        batch = torch.broadcast_shapes(v.shape[:-1], z.shape[:-1], w.shape[:-1])
        step = _chunk_length(batch, v.shape[-1], z.shape[-1])
        v_, w_ = v.unsqueeze(-2), w.unsqueeze(-2)
        return torch.cat(
            [(v_ / (zc.unsqueeze(-1) - w_)).sum(-1) for zc in z.split(step, dim=-1)], dim=-1
        )

    @staticmethod
    def backward(ctx, grad: Tensor):
        v, z, w = ctx.saved_tensors
        batch = torch.broadcast_shapes(v.shape[:-1], z.shape[:-1], w.shape[:-1])
        step = _chunk_length(batch, v.shape[-1], z.shape[-1])
        v_, w_ = v.unsqueeze(-2), w.unsqueeze(-2)
        sum_r = 0  # sum_l conj(G_l) / (z_l - w_n)
        sum_r2 = 0  # sum_l conj(G_l) / (z_l - w_n)^2
        grad_z = []
        for zc, gc in zip(z.split(step, dim=-1), grad.split(step, dim=-1)):
            r = 1.0 / (zc.unsqueeze(-1) - w_)  # ... x chunk x N
            gbar = gc.conj().unsqueeze(-1)
            sum_r = sum_r + (gbar * r).sum(-2)
            r2 = r * r
            sum_r2 = sum_r2 + (gbar * r2).sum(-2)
            grad_z.append(-gc * (v_ * r2).sum(-1).conj())
        grad_v = sum_r.conj().sum_to_size(v.shape) if ctx.needs_input_grad[0] else None
        grad_w = (v.conj() * sum_r2.conj()).sum_to_size(w.shape) if ctx.needs_input_grad[2] else None
        grad_z = torch.cat(grad_z, dim=-1).sum_to_size(z.shape) if ctx.needs_input_grad[1] else None
        return grad_v, grad_z, grad_w


def cauchy(v: Tensor, z: Tensor, w: Tensor) -> Tensor:
    """``out[..., l] = sum_n v[..., n] / (z[..., l] - w[..., n])`` for complex tensors.

    Args:
        v: ``... x N`` numerators.
        z: ``... x L`` evaluation points.
        w: ``... x N`` poles; leading dimensions of all three broadcast.
    Returns:
        ``... x L``.
    """
    return _Cauchy.apply(v, z, w)


class _Vandermonde(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, shift: Tensor, L: int) -> Tensor:
        ctx.save_for_backward(a, b, shift)
        ctx.L = L
        batch = torch.broadcast_shapes(a.shape[:-1], b.shape[:-1], shift.shape[:-1])
        step = _chunk_length(batch, a.shape[-1], L)
        k = torch.arange(L, dtype=shift.dtype, device=a.device)
        out = []
        for kc in k.split(step):
            E = torch.exp(b.unsqueeze(-1) * (kc - shift.unsqueeze(-1)))  # ... x N x chunk
            out.append((a.unsqueeze(-1) * E).sum(-2).real)
        return torch.cat(out, dim=-1)

    @staticmethod
    def backward(ctx, grad: Tensor):
        a, b, shift = ctx.saved_tensors
        batch = torch.broadcast_shapes(a.shape[:-1], b.shape[:-1], shift.shape[:-1])
        step = _chunk_length(batch, a.shape[-1], ctx.L)
        k = torch.arange(ctx.L, dtype=shift.dtype, device=a.device)
        sum_gE = 0  # sum_k g_k E_nk
        sum_gkE = 0  # sum_k g_k (k - s_n) E_nk
        for kc, gc in zip(k.split(step), grad.split(step, dim=-1)):
            t = kc - shift.unsqueeze(-1)
            gE = gc.unsqueeze(-2) * torch.exp(b.unsqueeze(-1) * t)
            sum_gE = sum_gE + gE.sum(-1)
            sum_gkE = sum_gkE + (gE * t).sum(-1)
        grad_a = sum_gE.conj().sum_to_size(a.shape) if ctx.needs_input_grad[0] else None
        grad_b = (a * sum_gkE).conj().sum_to_size(b.shape) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b, None, None


def vandermonde(a: Tensor, log_base: Tensor, L: int, shift: Tensor | None = None) -> Tensor:
    """``out[..., k] = Re(sum_n a[..., n] * exp(log_base[..., n] * (k - shift[..., n])))``, ``k < L``.

    ``shift`` (real, not differentiated) keeps ``exp`` in range when a base has modulus above one.

    Args:
        a: ``... x N`` complex coefficients.
        log_base: ``... x N`` complex logarithms of the Vandermonde bases.
        L: number of powers.
        shift: ``... x N`` real offsets, zero by default.
    Returns:
        ``... x L`` real.
    """
    complex_dtype = torch.promote_types(a.dtype, torch.complex64)
    a, log_base = a.to(complex_dtype), log_base.to(complex_dtype)
    if shift is None:
        shift = torch.zeros((), dtype=a.real.dtype, device=a.device)
    return _Vandermonde.apply(a, log_base, shift.expand(log_base.shape), L)
