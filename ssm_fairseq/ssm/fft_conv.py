"""Long convolutions through the FFT: causal, anti-causal and bidirectional, safe with padded batches.

A length-``L`` causal convolution ``y_k = sum_{j<=k} K_{k-j} u_j`` is a product of polynomials, computed as
``irfft(rfft(u, n) * rfft(K, n))[:L]``; zero padding to ``n >= 2L - 1`` removes the circular wrap-around, and
``n`` is a fast FFT size (``2^a`` or ``3 * 2^a``). The FFTs run in float32 (float64 for float64 inputs) whatever
autocast says. The circular convolution has its own backward: it keeps the real inputs, not their spectra, and
recomputes the spectra with real FFTs (a correlation for each input's gradient).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def check_input(u: Tensor, channels: int, name: str = "u") -> None:
    """Raise ``ValueError`` unless ``u`` is a real floating ``B x channels x L`` tensor."""
    if u.dim() != 3 or u.shape[1] != channels:
        raise ValueError(f"{name} must have shape (batch, {channels}, length), got {tuple(u.shape)}")
    if not u.is_floating_point():
        raise ValueError(f"{name} must be a real floating-point tensor, got dtype {u.dtype}")


def _check_kernel(u: Tensor, K: Tensor, D: Tensor | None, padding_mask: Tensor | None) -> None:
    if K.dim() != 3:
        raise ValueError(f"kernel must have shape (C, H, L), got {tuple(K.shape)}")
    check_input(u, K.shape[1])
    B, H, L = u.shape
    if K.shape[2] < L:
        raise ValueError(f"kernel must have shape (C, {H}, >={L}) for input {tuple(u.shape)}, got {tuple(K.shape)}")
    if D is not None and D.shape != K.shape[:2]:
        raise ValueError(f"skip D must have shape {tuple(K.shape[:2])}, got {tuple(D.shape)}")
    if padding_mask is not None and padding_mask.shape != (B, L):
        raise ValueError(f"padding_mask must have shape ({B}, {L}), got {tuple(padding_mask.shape)}")


def _compute_dtype(u: Tensor) -> torch.dtype:
    return torch.float64 if u.dtype == torch.float64 else torch.float32


def fft_size(n: int) -> int:
    """The smallest ``2^a`` or ``3 * 2^a`` that is at least ``n`` (sizes pocketfft and cuFFT transform fastest)."""
    power_of_two = 1 << max(0, n - 1).bit_length()
    three_times = 3 << max(0, (n - 1) // 3).bit_length()
    return min(power_of_two, three_times)


class _CircularConvolution(torch.autograd.Function):
    """``B x H x L`` inputs circularly convolved with ``C x H x n`` kernels, first ``L`` outputs: ``B x C x H x L``.

    Backward: ``grad_u = irfft(G conj(rfft K))[:L]`` summed over ``C`` and ``grad_K = irfft(G conj(rfft u))``
    summed over ``B``, with ``G = rfft(grad, n)``; only ``u`` and ``K`` are saved.
    """

    @staticmethod
    def forward(ctx, u: Tensor, k: Tensor) -> Tensor:
        n, L = k.shape[-1], u.shape[-1]
        ctx.save_for_backward(u, k)
        spectrum = torch.fft.rfft(u, n=n).unsqueeze(1) * torch.fft.rfft(k)
        return torch.fft.irfft(spectrum, n=n)[..., :L]

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        u, k = ctx.saved_tensors
        n, L = k.shape[-1], u.shape[-1]
        g = torch.fft.rfft(grad, n=n)  # B x C x H x (n/2 + 1)
        grad_u = grad_k = None
        if ctx.needs_input_grad[0]:
            grad_u = torch.fft.irfft((g * torch.fft.rfft(k).conj()).sum(1), n=n)[..., :L]
        if ctx.needs_input_grad[1]:
            grad_k = torch.fft.irfft((g * torch.fft.rfft(u, n=n).unsqueeze(1).conj()).sum(0), n=n)
        return grad_u, grad_k


def _finish(y: Tensor, u: Tensor, D: Tensor | None, padding_mask: Tensor | None, dtype: torch.dtype) -> Tensor:
    if D is not None:
        y = y + D.to(y.dtype).unsqueeze(-1) * u.unsqueeze(1)
    if padding_mask is not None:
        y = y.masked_fill(padding_mask[:, None, None, :], 0.0)
    return y.to(dtype)


def _prepare(u: Tensor, padding_mask: Tensor | None) -> Tensor:
    u = u.to(_compute_dtype(u))
    if padding_mask is not None:
        u = u.masked_fill(padding_mask.unsqueeze(1), 0.0)
    return u


def fft_conv(
    u: Tensor, K: Tensor, D: Tensor | None = None, padding_mask: Tensor | None = None, reverse: bool = False
) -> Tensor:
    """Convolve each channel with its SSM kernel, plus the skip term ``D u``.

    Args:
        u: ``B x H x L`` input.
        K: ``C x H x L'`` kernels (``L' >= L``; only the first ``L`` taps are used).
        D: ``C x H`` skip weights, or None.
        padding_mask: ``B x L``, True at padded positions: they are zeroed on input and output, so they never
            reach a real position in either direction.
        reverse: anti-causal, ``y_k = sum_{j>=k} K_{j-k} u_j`` (the reversed sequence's causal output, reversed).
    Returns:
        ``B x C x H x L`` in the dtype of ``u``.
    """
    _check_kernel(u, K, D, padding_mask)
    L = u.shape[-1]
    x = _prepare(u, padding_mask)
    k, n = K[..., :L].to(x.dtype), fft_size(2 * L - 1)
    if reverse:  # put tap m at lag -m (index n - m) of the circle
        k = torch.cat([k[..., :1], k.new_zeros(k.shape[:-1] + (n - L,)), k[..., 1:].flip(-1)], dim=-1)
    else:
        k = F.pad(k, (0, n - L))
    return _finish(_CircularConvolution.apply(x, k), x, D, padding_mask, u.dtype)


def bidirectional_fft_conv(
    u: Tensor, K_forward: Tensor, K_backward: Tensor, D: Tensor | None = None, padding_mask: Tensor | None = None
) -> Tensor:
    """Sum of a causal and an anti-causal convolution, in one FFT pass.

    ``y = fft_conv(u, K_forward) + fft_conv(u, K_backward, reverse=True) + D u``; shapes as in ``fft_conv``.
    """
    _check_kernel(u, K_forward, D, padding_mask)
    _check_kernel(u, K_backward, None, padding_mask)
    L = u.shape[-1]
    x = _prepare(u, padding_mask)
    kf, kb, n = K_forward[..., :L].to(x.dtype), K_backward[..., :L].to(x.dtype), fft_size(2 * L - 1)
    zeros = kf.new_zeros(kf.shape[:-1] + (n - 2 * L + 1,))
    k = torch.cat([kf[..., :1] + kb[..., :1], kf[..., 1:], zeros, kb[..., 1:].flip(-1)], -1)
    return _finish(_CircularConvolution.apply(x, k), x, D, padding_mask, u.dtype)
