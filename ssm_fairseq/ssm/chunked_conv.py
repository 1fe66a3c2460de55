"""The convolution of a real diagonal SSM computed chunk by chunk: matrix products instead of FFTs.

For a diagonal system with real ``dA`` (the MSSM kernel after ``eigh``) the output of the length-``L``
convolution ``y_k = sum_(i<=k) K_(k-i) u_i + D u_k``, ``K_k = sum_n dC_n dA_n^k dB_n``, splits into chunks of
``T`` positions. With ``s_c`` the ``N`` states after chunk ``c`` (``s_(-1) = 0``)::

    y_(cT+j) = sum_(i<=j) K'_(j-i) u_(cT+i)  +  sum_n dC_n dA_n^(j+1) s_(c-1),n       (K' = K with D added at tap 0)
    s_c      = dA^T s_(c-1)  +  sum_i dA^(T-1-i) dB u_(cT+i)

The first term is a ``T x T`` lower-triangular Toeplitz matrix of the first ``T`` taps, the second and the chunk's
contribution to the state are ``T x N`` matrices: three batched matrix products over all chunks at once (one
batch per channel); only the recurrence between chunks (``L / T`` steps on ``B x H x N`` states) runs in
sequence. Per position and channel this costs ``C T + N + C N`` multiply-adds, about an FFT convolution's
operation count, but as dense matrix products, which a CPU runs several times faster than FFTs of length ``2L``;
nothing of length ``L`` is built but the input's and the output's copies (no ``L`` kernel taps, no spectra), and
autograd differentiates it as it stands, except that the states between chunks are computed again in the backward
pass rather than kept (``_carried``).

The result equals ``fft_conv(u, real_vandermonde(dC dB, dA, L), D)`` (tested, with padding, both directions and
gradients). Powers of ``dA`` below ``tiny ** (1/3)`` of the dtype are held at that number, as in
``structured_products.real_vandermonde``, so that subnormal numbers never slow the products down.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .fft_conv import check_input, compute_dtype


class DiagonalSystem(NamedTuple):
    """What ``chunked_diagonal_conv`` convolves with: ``dA``, ``dB``: ``H x N``, ``dC``: ``C x H x N``, ``D``: ``C x H``."""

    dA: Tensor
    dB: Tensor
    dC: Tensor
    D: Tensor


def chunk_length(L: int, batch: int = 1) -> int:
    """``T`` for a length-``L`` convolution of ``batch`` sequences: the power of two nearest
    ``max(sqrt(L) / 2, sqrt(batch L) / 3)``, from 8 to 64.

    The Toeplitz products cost ``C T`` per position and the sequential recurrence ``L / T`` steps, each over the whole
    batch; for 1024 channels on a 2-core CPU, forward + backward, batch 1, 32 was fastest at 4k positions (203 ms
    against 228 for 64), 64 at 16k (836 ms against 1129 for 32 and 1812 for 16); in a width-512 MSSM layer at batches of
    2,000 positions 16, at 10,000 positions (``fairseq-train --max-tokens 40000`` after 4x sub-sampling) 32
    (``scripts/benchmarks/chunked_conv.py --layer``)."""
    target = max(math.sqrt(L) / 2, math.sqrt(batch * L) / 3)
    return 1 << min(6, max(3, round(math.log2(target))))


def default_chunk(L: int, batch: int = 1) -> int:
    """``T`` of a length-``L`` convolution of ``batch`` sequences: ``chunk_length(L, batch)``, at most ``L``."""
    return min(chunk_length(L, batch), L)


def diagonal_powers(dA: Tensor, count: int) -> Tensor:
    """``dA ** k`` for ``k < count``: ``... x N`` -> ``... x N x count``, differentiable, for real ``dA`` of any
    sign with ``|dA| <= 1``. A power ``k >= 2`` below ``tiny ** (1/3)`` in magnitude takes that magnitude (its
    derivative, below ``k tiny ** (1/3)``, is dropped); powers 0 and 1 are exact, so is the derivative at ``dA = 0``."""
    k = torch.arange(2, max(count, 2), device=dA.device)
    log_smallest = math.log(torch.finfo(dA.dtype).tiny) / 3
    log_abs = torch.log(dA.abs().clamp_min(torch.finfo(dA.dtype).tiny)).unsqueeze(-1)
    magnitude = torch.exp((log_abs * k.to(dA.dtype)).clamp_min(log_smallest))
    higher = torch.where((dA < 0).unsqueeze(-1) & (k % 2 == 1), -magnitude, magnitude)
    return torch.cat([torch.ones_like(dA).unsqueeze(-1), dA.unsqueeze(-1), higher], -1)[..., :count]


class _StatesBeforeChunks(torch.autograd.Function):
    """``states[c] = sum decay^(|c - c'| - 1) contributions[c']`` over the chunks ``c'`` before ``c`` (after it, with
    ``reverse``): the state each chunk starts from, along dimension 2.

    ``contributions``: ``H x B x chunks x N``, ``decay`` (``dA^T``): ``H x 1 x N``. One in-place step per chunk,
    forward and backward, instead of an autograd node per chunk. Backward, walking the chunks the other way, with ``g``
    the gradient of ``states`` and ``c - 1`` the chunk processed before ``c``:
    ``lambda_c = g_c + decay lambda_(c+1)`` (the gradient reaching state ``c`` through all later ones),
    ``grad contributions_c = lambda_(c+1)``, ``grad decay = sum_(c >= 1) lambda_c states_(c-1)``.
    """

    @staticmethod
    def forward(ctx, contributions: Tensor, decay: Tensor, reverse: bool) -> Tensor:
        chunks = contributions.shape[2]
        order = list(range(chunks - 1, -1, -1) if reverse else range(chunks))
        states = torch.empty_like(contributions)
        state = torch.zeros_like(contributions[:, :, 0])
        for c in order:
            states[:, :, c] = state
            state.mul_(decay).add_(contributions[:, :, c])
        ctx.save_for_backward(states, decay)
        ctx.order = order
        return states

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        states, decay = ctx.saved_tensors
        order = ctx.order
        grad_contributions = torch.zeros_like(grad)
        grad_decay = torch.zeros_like(states[:, :, 0])
        reaching = torch.zeros_like(grad[:, :, 0])  # lambda_(c+1)
        for c, before in zip(order[:0:-1], order[-2::-1]):
            reaching.mul_(decay).add_(grad[:, :, c])  # lambda_c
            grad_contributions[:, :, before] = reaching
            grad_decay.addcmul_(reaching, states[:, :, before])
        return grad_contributions, grad_decay.sum(1, keepdim=True), None


def _states_before_chunks(rows: Tensor, into_state: Tensor, decay: Tensor, batch: int, reverse: bool) -> Tensor:
    """The state each chunk starts from, ``H x (B chunks) x N``, from the chunks' inputs ``rows`` (``H x (B chunks) x
    T``), ``into_state`` (``H x T x N``) and ``decay`` (``dA^T``, ``H x 1 x N``)."""
    H, rows_count, _ = rows.shape
    contributions = (rows @ into_state).view(H, batch, rows_count // batch, -1)
    return _StatesBeforeChunks.apply(contributions, decay, reverse).view(H, rows_count, -1)


def _carried(rows: Tensor, into_state: Tensor, decay: Tensor, from_state: Tensor, batch: int, reverse: bool) -> Tensor:
    """What the states carried between chunks add to the outputs, ``H x (B chunks) x (C T)`` (``from_state``: ``H x N
    x C T``). With autograd it runs again in the backward pass (``checkpoint``), so that the states are not kept: with
    ``N`` = 32 and chunks of 32 they are as large as the input."""
    return _states_before_chunks(rows, into_state, decay, batch, reverse) @ from_state


class ChunkMatrices(NamedTuple):
    """What ``chunk_convolution`` multiplies chunks of ``T`` positions by (``chunk_matrices``): ``toeplitz``: ``H x T x
    (C T)``, a chunk's inputs to its outputs (the first ``T`` taps, ``D`` added at lag 0); ``into_state``: ``H x T x
    N``, its inputs to the state it passes on; ``from_state``: ``H x N x (C T)``, the state it starts from to its
    outputs; ``decay``: ``H x 1 x N``, ``dA^T``."""

    toeplitz: Tensor
    into_state: Tensor
    from_state: Tensor
    decay: Tensor


def chunk_matrices(system: DiagonalSystem, T: int, reverse: bool = False,
                   dtype: torch.dtype | None = None) -> ChunkMatrices:
    """The matrices of ``system`` for chunks of ``T`` positions, in ``dtype`` (default ``dA``'s): they depend on the
    parameters only, so that inference keeps them (``DiagonalSSMKernel.chunk_matrices``). ``reverse``: anti-causal,
    the Toeplitz matrices transposed and the powers into and out of the states reversed."""
    dA, dB, dC, D = (None if t is None else t.to(dtype or system.dA.dtype) for t in system)
    H, N = dA.shape
    C = dC.shape[0]
    powers = diagonal_powers(dA, T + 1)  # H x N x (T + 1)
    taps = torch.einsum("chn,hnk->chk", dC * dB, powers[..., :T])  # C x H x T
    if D is not None:
        taps = torch.cat([taps[..., :1] + D.unsqueeze(-1), taps[..., 1:]], dim=-1)
    lag = torch.arange(T, device=dA.device)
    lag = lag - lag.unsqueeze(1)  # [i, j]: output j's lag behind input i
    if reverse:
        lag = -lag
    toeplitz = (taps[..., lag.clamp_min(0)] * (lag >= 0)).permute(1, 2, 0, 3).reshape(H, T, C * T)
    # input i of a chunk reaches the state it passes on through dA^(T-1-i) dB (dA^i dB backwards), and the state
    # a chunk starts from reaches its output j through dC dA^(j+1) (dC dA^(T-j) backwards)
    into_state = powers[..., :T] if reverse else powers[..., :T].flip(-1)
    into_state = (into_state * dB.unsqueeze(-1)).transpose(1, 2)  # H x T x N
    from_state = powers[..., 1:].flip(-1) if reverse else powers[..., 1:]  # H x N x T
    from_state = (dC.transpose(0, 1).unsqueeze(-1) * from_state.unsqueeze(1)).transpose(1, 2)  # H x N x C x T
    return ChunkMatrices(toeplitz, into_state, from_state.reshape(H, N, C * T), powers[:, None, :, T])


def chunked_diagonal_conv(
    u: Tensor, dA: Tensor, dB: Tensor, dC: Tensor, D: Tensor | None = None, padding_mask: Tensor | None = None,
    reverse: bool = False, chunk: int | None = None,
) -> Tensor:
    """Convolve each channel of ``u`` with its real diagonal SSM, plus the skip term ``D u``.

    Args:
        u: ``B x H x L`` input.
        dA, dB: ``H x N`` real discrete state matrix (its diagonal, ``|dA| <= 1``) and input vector.
        dC: ``C x H x N`` output rows.
        D: ``C x H`` skip weights, or None.
        padding_mask: ``B x L``, True at padded positions: zeroed on input and output, as in ``fft_conv``.
        reverse: anti-causal, ``y_k = sum_(j>=k) K_(j-k) u_j``: the Toeplitz matrices transposed, the states
            carried from the last chunk to the first (nothing is flipped).
        chunk: ``T`` (default ``chunk_length(L, B)``).
    Returns:
        ``B x C x H x L`` in the dtype of ``u``; computed in float32 (float64 for float64 inputs), also under autocast.
    """
    check_input(u, dA.shape[0])
    if dA.is_complex() or dA.shape != dB.shape or dC.shape[1:] != dA.shape:
        raise ValueError(f"need real dA, dB of shape (H, N) and dC of shape (C, H, N), got {tuple(dA.shape)}, "
                         f"{tuple(dB.shape)}, {tuple(dC.shape)}")
    B, H, L = u.shape
    T = min(chunk, L) if chunk else default_chunk(L, B)
    with torch.autocast(device_type=u.device.type, enabled=False):
        matrices = chunk_matrices(DiagonalSystem(dA, dB, dC, D), T, reverse, compute_dtype(u))
    return convolve_batch_first(u, matrices, padding_mask, reverse)


def convolve_batch_first(u: Tensor, matrices: ChunkMatrices, padding_mask: Tensor | None = None,
                         reverse: bool = False) -> Tensor:
    """``chunked_diagonal_conv`` with the system's ``chunk_matrices`` (``reverse`` as they were built), batch first:
    ``u``: ``B x H x L`` -> ``B x C x H x L`` in ``u``'s dtype; padded positions zeroed on input and output. What a
    stack convolves with in training, where its stages run batch first as with FFT convolutions (``MultiHeadSSM``):
    the input is transposed into rows of chunks and the output back, each once, out of place."""
    check_input(u, matrices.toeplitz.shape[0])
    B, H, L = u.shape
    T = matrices.toeplitz.shape[1]
    C = matrices.toeplitz.shape[2] // T
    padded = padded_length(L, T)
    with torch.autocast(device_type=u.device.type, enabled=False):
        x = u.to(matrices.decay.dtype)
        if padding_mask is not None:
            x = x.masked_fill(padding_mask.unsqueeze(1), 0.0)
        if padded != L:
            x = torch.nn.functional.pad(x, (0, padded - L))
        rows = x.transpose(0, 1).reshape(H, B * (padded // T), T)  # H x (B chunks) x T, a view where B = 1
        if 1 not in rows.stride()[1:]:  # from a channel-last input (B x L x H transposed) the matrix
            rows = rows.contiguous()  # products would copy it matrix by matrix
        y = _chunk_products(rows, matrices, B, reverse)  # H x (B chunks) x (C T)
        y = y.view(H, B, padded // T, C, T).permute(1, 3, 0, 2, 4).reshape(B, C, H, padded)[..., :L]
        if padding_mask is not None:
            y = y.masked_fill(padding_mask[:, None, None, :], 0.0)
        return y.to(u.dtype)


def _chunk_products(rows: Tensor, matrices: ChunkMatrices, batch: int, reverse: bool) -> Tensor:
    """The chunks' outputs ``H x (B chunks) x (C T)`` from their inputs ``rows`` (``H x (B chunks) x T``): the
    Toeplitz product plus the states carried between chunks (with autograd computed again in the backward pass)."""
    y = rows @ matrices.toeplitz
    carried = (rows, matrices.into_state, matrices.decay)
    if torch.is_grad_enabled():  # the states computed again in the backward pass, not kept
        return y.add_(checkpoint(_carried, *carried, matrices.from_state, batch, reverse, use_reentrant=False))
    return y.baddbmm_(_states_before_chunks(*carried, batch, reverse), matrices.from_state)


def padded_length(L: int, T: int) -> int:
    """``L`` rounded up to whole chunks of ``T``."""
    return -(-L // T) * T


# ``write_row(c, out)`` of ``chunk_convolution``: output row ``c`` written into ``out``, which it returns
RowWriter = Callable[[int, Tensor], Tensor]


def chunk_convolution(rows: Tensor, matrices: ChunkMatrices, reverse: bool = False) -> RowWriter:
    """The chunked convolution of ``H x B x L'`` inputs (``L'`` whole chunks; padded positions already zeroed, in the
    matrices' dtype) with the system of ``matrices`` (``chunk_matrices``, ``reverse`` as they were built), without
    autograd, one output row at a time: the states carried between chunks are computed here, once, and the returned
    ``write_row(c, out)`` writes output row ``c`` (``H x B x L'``) into ``out`` (contiguous, of that shape and the
    matrices' dtype) by its two products, in place, and returns ``out``. A caller that consumes each row before the
    next (an activation) holds one row beside its result, not ``C``: at the recipe's batch a row is about 20 MB, under
    the size (32 MiB) above which glibc maps every allocation afresh, so that it is not faulted in page by page at
    every call (docs/benchmarks.md)."""
    if torch.is_grad_enabled():
        raise RuntimeError("chunk_convolution writes its outputs in place: it runs without autograd "
                           "(convolve_batch_first has autograd)")
    H, B, padded = rows.shape
    T = matrices.toeplitz.shape[1]
    C = matrices.toeplitz.shape[2] // T
    rows = rows.view(H, B * (padded // T), T)  # one chunk a row
    states = _states_before_chunks(rows, matrices.into_state, matrices.decay, B, reverse)
    toeplitz, from_state = matrices.toeplitz.unflatten(2, (C, T)), matrices.from_state.unflatten(2, (C, T))

    def write_row(c: int, out: Tensor) -> Tensor:
        y = out.view(rows.shape)
        torch.bmm(rows, toeplitz[:, :, c], out=y)
        y.baddbmm_(states, from_state[:, :, c])
        return out
    return write_row
