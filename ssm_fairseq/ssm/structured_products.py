"""Fast, memory-bounded Cauchy and Vandermonde products: the two sums that SSM kernels reduce to.

Both are sums over the state dimension ``N`` of an ``N x L`` structured matrix. Written naively they cost
``O(... x N x L)`` elementwise transcendental operations, and autograd keeps the whole matrix for the backward
pass. Here:

* ``vandermonde`` factors each power ``k = q m + r`` (``m ~ sqrt(L)``) as ``base^(q m) * base^r``, so only
  ``O(... x N x sqrt(L))`` exponentials are evaluated and the sum over ``N`` is one batched matrix product;
  autograd then stores only the small factors.
* ``real_vandermonde`` is the same factorisation for real bases of any sign (the MSSM kernel after ``eigh``):
  ``base^k = sign^k |base|^k`` with both factors split the same way, in real arithmetic only, the rows that
  share a base stacked into one matrix product, and powers that would underflow held at a normal number.
* ``cauchy`` shares the reciprocals ``1 / (z_l - w_n)`` between all numerator rows, sums them with a batched
  matrix product, and walks over ``L`` in chunks in the forward and backward pass (custom autograd), so peak
  memory is ``O(... x (N + L))`` plus one chunk (``CAUCHY_CHUNK_ELEMENTS``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

# Elements of one chunk of a structured matrix (complex128 at this size is 64 MiB).
CHUNK_ELEMENTS = 1 << 22
# The Cauchy sums' chunk of reciprocals: 2 MiB of complex64, small enough to stay in cache; S4's kernel generation
# (forward and backward) is then faster and far smaller than with CHUNK_ELEMENTS (docs/benchmarks.md, SSM layers).
CAUCHY_CHUNK_ELEMENTS = 1 << 18
# On a GPU each chunk costs a handful of kernel launches, which outweigh its arithmetic at CPU-sized chunks (S4 at
# 16k tokens would launch over a thousand kernels): 64 MiB of complex64 per chunk there.
CUDA_CAUCHY_CHUNK_ELEMENTS = 1 << 23


def _chunk_length(batch_shape: torch.Size, N: int, L: int, device: torch.device) -> int:
    """Positions of ``z`` per chunk of the ``batch_shape x chunk x N`` reciprocals."""
    per_position = max(1, batch_shape.numel() * N)
    elements = CUDA_CAUCHY_CHUNK_ELEMENTS if device.type == "cuda" else CAUCHY_CHUNK_ELEMENTS
    return max(1, min(L, elements // per_position))


def _rows_last(v: Tensor, pole_batch: torch.Size) -> tuple[Tensor, torch.Size]:
    """``v``: ``extra... x pole_batch... x N`` -> ``pole_batch... x E x N`` (E = prod(extra)), for one GEMM."""
    extra = v.shape[: max(0, v.dim() - 1 - len(pole_batch))]
    v = v.expand(extra + pole_batch + v.shape[-1:]).reshape((-1,) + pole_batch + v.shape[-1:])
    return v.movedim(0, -2), extra


def _rows_first(x: Tensor, extra: torch.Size) -> Tensor:
    """Inverse of ``_rows_last`` for a ``pole_batch... x E x L`` result."""
    x = x.movedim(-2, 0)
    return x.reshape(extra + x.shape[1:])


class _Cauchy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v: Tensor, z: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(v, z, w)
        pole_batch = torch.broadcast_shapes(z.shape[:-1], w.shape[:-1])
        step = _chunk_length(pole_batch, w.shape[-1], z.shape[-1], z.device)
        rows, extra = _rows_last(v, pole_batch)  # pole_batch x E x N
        out = []
        for zc in z.split(step, dim=-1):
            r = 1.0 / (zc.unsqueeze(-1) - w.unsqueeze(-2))  # pole_batch x chunk x N
            out.append(rows @ r.transpose(-1, -2))
        return _rows_first(torch.cat(out, dim=-1), extra)

    @staticmethod
    def backward(ctx, grad: Tensor):
        # For the holomorphic f = v / (z - w): grad_input = sum(grad * conj(df/dinput)).
        v, z, w = ctx.saved_tensors
        pole_batch = torch.broadcast_shapes(z.shape[:-1], w.shape[:-1])
        step = _chunk_length(pole_batch, w.shape[-1], z.shape[-1], z.device)
        rows, extra = _rows_last(v, pole_batch)  # pole_batch x E x N
        grad_rows, _ = _rows_last(grad, pole_batch)  # pole_batch x E x L
        sum_r = 0  # sum_l conj(G_l) r_ln, pole_batch x E x N
        sum_r2 = 0  # sum_l conj(G_l) r_ln^2
        grad_z = []
        for zc, gc in zip(z.split(step, dim=-1), grad_rows.split(step, dim=-1)):
            r = 1.0 / (zc.unsqueeze(-1) - w.unsqueeze(-2))
            r2 = r * r
            gbar = gc.conj()
            sum_r = sum_r + gbar @ r
            sum_r2 = sum_r2 + gbar @ r2
            grad_z.append(-gc * (rows @ r2.transpose(-1, -2)).conj())
        grad_v = grad_z_ = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_v = _rows_first(sum_r.conj(), extra).sum_to_size(v.shape)
        if ctx.needs_input_grad[1]:
            grad_z_ = _rows_first(torch.cat(grad_z, dim=-1), extra).sum_to_size(z.shape)
        if ctx.needs_input_grad[2]:
            grad_w = _rows_first(rows.conj() * sum_r2.conj(), extra).sum_to_size(w.shape)
        return grad_v, grad_z_, grad_w


def cauchy(v: Tensor, z: Tensor, w: Tensor) -> Tensor:
    """``out[..., l] = sum_n v[..., n] / (z[..., l] - w[..., n])`` for complex tensors.

    Args:
        v: ``... x N`` numerators.
        z: ``... x L`` evaluation points.
        w: ``... x N`` poles; leading dimensions of all three broadcast. The reciprocals are computed once for
            the broadcast shape of ``z`` and ``w`` and shared by the rows of ``v``.
    Returns:
        ``... x L``.
    """
    return _Cauchy.apply(v, z, w)


def vandermonde(a: Tensor, log_base: Tensor, L: int, shift: Tensor | None = None) -> Tensor:
    """``out[..., k] = Re(sum_n a[..., n] * exp(log_base[..., n] * (k - shift[..., n])))``, ``k < L``.

    ``shift`` (real, not differentiated) is the position of each row's largest term: 0 for decaying rows
    (``Re(log_base) <= 0``) and typically ``L - 1`` for growing ones, so every exponential stays in range.

    Args:
        a: ``... x N`` coefficients (real or complex).
        log_base: ``... x N`` logarithms of the Vandermonde bases.
        L: number of powers.
        shift: ``... x N`` real offsets, zero by default.
    Returns:
        ``... x L`` real.
    """
    complex_dtype = torch.promote_types(a.dtype, torch.complex64)
    a, b = a.to(complex_dtype), log_base.to(complex_dtype)
    real_dtype = a.real.dtype
    shift = torch.zeros((), dtype=real_dtype, device=a.device) if shift is None else shift.to(real_dtype)
    shift = shift.expand(b.shape).unsqueeze(-1)
    b_ = b.unsqueeze(-1)
    m = max(1, math.isqrt(L))
    blocks, rest = divmod(L, m)
    # Powers q m + r with r measured from r0: 0 for decaying rows, m - 1 for growing ones, so that both
    # factors have non-positive exponents inside the first ``blocks * m`` positions.
    r0 = (b.real > 0).to(real_dtype).unsqueeze(-1) * (m - 1)
    q = torch.arange(blocks, dtype=real_dtype, device=a.device) * m
    r = torch.arange(m, dtype=real_dtype, device=a.device)
    coarse = a.unsqueeze(-1) * torch.exp(b_ * (q - shift + r0))  # ... x N x blocks
    fine = torch.exp(b_ * (r - r0))  # ... x N x m
    # Re(sum_n coarse_nq fine_nr) as one real matrix product over the stacked real and imaginary parts
    lhs = torch.cat([coarse.real, -coarse.imag], dim=-2).transpose(-1, -2)  # ... x blocks x 2N
    rhs = torch.cat([fine.real, fine.imag], dim=-2)  # ... x 2N x m
    out = (lhs @ rhs).flatten(-2)
    if rest:
        k = torch.arange(blocks * m, L, dtype=real_dtype, device=a.device)
        tail = (a.unsqueeze(-1) * torch.exp(b_ * (k - shift))).sum(-2).real
        out = torch.cat([out, tail], dim=-1)
    return out


def _block_length(L: int, rows: int) -> int:
    """``m`` for ``_real_powers`` when ``rows`` coefficient rows share each base: their products with the coarse
    powers cost ``rows x L / m`` elementwise operations per state and the fine powers ``m``; ``sqrt(rows L)``
    balances the two."""
    return min(L, max(1, math.isqrt(L * rows)))


def _magnitude_and_sign(base: Tensor) -> tuple[Tensor, Tensor]:
    """``log |base|`` (a zero base at the log of the smallest normal number) and ``sign(base)`` (0 for a zero base):
    what ``_real_powers`` raises to every power, ``... x N`` each. Kept for the backward pass instead of ``base``."""
    return torch.log(base.abs().clamp_min(torch.finfo(base.dtype).tiny)), torch.sign(base)


def _exponents(L: int, m: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """The powers ``_real_powers`` takes, ``0, m, ..., (blocks - 1) m`` then ``0, 1, ..., m - 1``, and their parities,
    each ``(blocks + m) x 1``: built from Python numbers, so that they cost no operator on any device."""
    powers = [q * m for q in range(-(-L // m))] + list(range(m))
    exponents = torch.tensor(powers, dtype=dtype, device=device).unsqueeze(-1)
    return exponents, torch.tensor([k % 2 for k in powers], dtype=dtype, device=device).unsqueeze(-1)


def _real_powers(log_abs: Tensor, sign: Tensor, L: int, m: int) -> tuple[Tensor, Tensor]:
    """``base ** (q m)`` (``... x blocks x N``) and ``base ** r`` (``... x m x N``) such that
    ``base ** k = coarse[q] * fine[r]`` for ``k = q m + r``; ``blocks * m >= L``; from ``_magnitude_and_sign(base)``.

    Both tables are one computation (five operators): ``|base| ** k`` is ``exp(k log |base|)`` with the exponent
    clamped at a third of the log of the smallest normal number, times ``sign ** (k mod 2)``. A power below
    ``tiny ** (1/3)`` (2e-13 in float32, 3e-103 in float64, far below their rounding errors) takes that value instead.
    Most powers of a decaying mode underflow at speech lengths, and subnormal numbers (results of ``exp`` or of
    products in the matrix product) are more than ten times slower on CPU; with the clamp, the products of two powers
    and a coefficient stay normal. A zero base's odd powers are exactly 0 and its even ones ``tiny ** (1/3)``
    (``0 ** 0`` is 1).
    """
    exponents, parities = _exponents(L, m, log_abs.dtype, log_abs.device)
    power = torch.exp_((log_abs.unsqueeze(-2) * exponents).clamp_min_(math.log(torch.finfo(log_abs.dtype).tiny) / 3))
    power.mul_(sign.unsqueeze(-2).pow(parities))  # the last block may run past L: |base| <= 1, harmless
    return power.split([exponents.shape[0] - m, m], dim=-2)


def _real_vandermonde_transposed(g: Tensor, coarse: Tensor, fine: Tensor, base_batch: torch.Size) -> Tensor:
    """``sum_k g[..., k] base[..., n] ** k`` from the factors of ``_real_powers``: ``... x L`` -> ``... x N``.

    The rows of ``g`` that share a base are stacked into one matrix product per base row, as in the forward pass.
    """
    L, blocks, m = g.shape[-1], coarse.shape[-2], fine.shape[-2]
    rows, extra = _rows_last(g, base_batch)  # base_batch x E x L
    rows = F.pad(rows, (0, blocks * m - L)).unflatten(-1, (blocks, m)).flatten(-3, -2)  # ... x E blocks x m
    per_block = (rows @ fine).unflatten(-2, (-1, blocks))  # sum over r: base_batch x E x blocks x N
    return _rows_first((per_block * coarse.unsqueeze(-3)).sum(-2), extra)


class _RealVandermonde(torch.autograd.Function):
    """``out_k = sum_n a_n b_n^k`` from the factors of ``_real_powers``. The rows of ``a`` that share a base (its
    leading dimensions beyond the base's) are stacked into one matrix product per base row. Keeps only ``a`` and
    ``log |base|`` and ``sign(base)`` (``_magnitude_and_sign``) for the backward pass, which recomputes the factors
    from them. There ``dL/da_n = sum_k g_k b_n^k`` and
    ``dL/db_n = a_n sum_k (k + 1) g_(k+1) b_n^k``: two transposed Vandermonde products, computed as one (no division
    by the base, so a zero base is exact)."""

    @staticmethod
    def forward(ctx, a: Tensor, base: Tensor, L: int) -> Tensor:
        batch = torch.broadcast_shapes(a.shape[:-1], base.shape[:-1])
        base_batch = batch[len(batch) - base.dim() + 1:]
        rows, extra = _rows_last(a, base_batch)  # base_batch x E x N
        m = _block_length(L, rows.shape[-2])
        log_abs, sign = _magnitude_and_sign(base.expand(base_batch + base.shape[-1:]))
        coarse, fine = _real_powers(log_abs, sign, L, m)
        blocks = coarse.shape[-2]
        lhs = (rows.unsqueeze(-2) * coarse.unsqueeze(-3)).flatten(-3, -2)  # base_batch x E blocks x N
        out = (lhs @ fine.transpose(-1, -2)).unflatten(-2, (rows.shape[-2], blocks))  # ... x E x blocks x m
        ctx.save_for_backward(a, log_abs, sign)
        ctx.L, ctx.m, ctx.base_shape = L, m, base.shape
        return _rows_first(out.flatten(-2)[..., :L], extra)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        a, log_abs, sign = ctx.saved_tensors
        L, m = ctx.L, ctx.m
        base_batch = log_abs.shape[:-1]
        coarse, fine = _real_powers(log_abs, sign, L, m)
        needs_a, needs_base = ctx.needs_input_grad[:2]
        rows = [grad] if needs_a else []
        if needs_base:
            k = torch.arange(1, L, dtype=grad.dtype, device=grad.device)
            rows.append(F.pad(grad[..., 1:] * k, (0, 1)))  # (k + 1) g_(k+1), zero past the end
        # both transposed products in one: the two gradients' rows stacked
        sums = _real_vandermonde_transposed(torch.stack(rows) if len(rows) > 1 else rows[0].unsqueeze(0), coarse,
                                            fine, base_batch)
        grad_a = sums[0].sum_to_size(a.shape) if needs_a else None
        grad_base = (a * sums[-1]).sum_to_size(ctx.base_shape) if needs_base else None
        return grad_a, grad_base, None


def real_vandermonde(a: Tensor, base: Tensor, L: int) -> Tensor:
    """``out[..., k] = sum_n a[..., n] * base[..., n] ** k`` for real bases with ``|base| <= 1``, ``k < L``.

    ``base^(q m + r) = (sign^(q m) |base|^(q m)) (sign^r |base|^r)``: real exponentials of ``log |base|`` and
    parities of the sign, then one real matrix product over ``N``. A power below ``tiny ** (1/3)`` of the dtype
    (2e-13 in float32) is computed as that number, far below the rounding error of the sum; a zero base gives
    ``0^0 = 1``. Custom autograd: only ``a`` and the base's magnitude and sign are kept for the backward pass, which
    recomputes the powers, so memory stays ``O(... x N)`` however long the kernel.

    Args:
        a: ``... x N`` real coefficients.
        base: ``... x N`` real bases (broadcastable with ``a``), magnitude at most 1.
        L: number of powers.
    Returns:
        ``... x L`` real.
    """
    return _RealVandermonde.apply(a, base, L)
