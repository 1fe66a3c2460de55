"""Long convolutions through the FFT: causal, anti-causal and bidirectional, safe with padded batches.

A length-``L`` causal convolution ``y_k = sum_{j<=k} K_{k-j} u_j`` is a product of polynomials, computed as
``irfft(rfft(u, n) * rfft(K, n))[:L]``; zero padding to ``n >= 2L - 1`` removes the circular wrap-around, and
``n`` is a fast FFT size (``2^a`` or ``3 * 2^a``). An anti-causal kernel's spectrum is the conjugate of the causal
one's, and the skip term ``D u`` is the kernel's tap 0, so every form is one product of spectra. The FFTs run in
float32 (float64 for float64 inputs) whatever autocast says. The convolution has its own backward: it keeps the
input (not its spectrum, which depends on the batch and is two to three times its size) and the kernels' spectrum (which does
not depend on the batch), and recomputes the input's spectrum with a real FFT (a correlation for each input's
gradient).
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


def compute_dtype(u: Tensor) -> torch.dtype:
    """The dtype the convolutions of ``u`` compute in: float64 for float64 inputs, float32 otherwise (autocast too)."""
    return torch.float64 if u.dtype == torch.float64 else torch.float32


def fft_size(n: int) -> int:
    """The smallest ``2^a`` or ``3 * 2^a`` that is at least ``n`` (sizes pocketfft and cuFFT transform fastest)."""
    power_of_two = 1 << max(0, n - 1).bit_length()
    three_times = 3 << max(0, (n - 1) // 3).bit_length()
    return min(power_of_two, three_times)


class _SpectralConvolution(torch.autograd.Function):
    """``B x H x L`` inputs convolved with kernels given by their spectrum: ``B x C x H x L``, or two-way ``B x 2 x C x
    H/2 x L``.

    ``kernel_spectrum`` (``C x H x F``, ``F = n/2 + 1``, ``n`` the FFT size) comes from ``_KernelSpectrum``; two-way
    (``2 x C x H/2 x F``: direction 0 causal and 1 anti-causal, for the two halves of the channels, the directions of a
    bidirectional block in one FFT pair) from ``_TwoWaySpectra``. Saved are ``u`` and the spectrum (no FFT of the
    kernels in the backward pass). Backward, with ``G = rfft(grad, n)``: ``grad_u = irfft(G conj(K))[:L]`` summed over
    ``C``; the spectrum receives ``X = G conj(rfft u)`` summed over ``B``, of which the causal taps' gradient is
    ``irfft(X)[:L]`` and the anti-causal taps' ``irfft(conj X)[:L]`` (the spectrum functions' backward passes). Two-way,
    direction 1 of ``X`` is conjugated here (in place), so that ``_TwoWaySpectra`` transforms all of it alike. This
    ``X`` is what these functions pass between them, not autograd's gradient of a complex tensor: a spectrum that
    requires a gradient must come from one of them.
    """

    @staticmethod
    def forward(ctx, u: Tensor, kernel_spectrum: Tensor, two_way: bool = False) -> Tensor:
        n, L = fft_size(2 * u.shape[-1] - 1), u.shape[-1]
        ctx.save_for_backward(u, kernel_spectrum)
        ctx.two_way = two_way
        return torch.fft.irfft(_input_spectrum(u, n, two_way) * kernel_spectrum, n=n)[..., :L]

    @staticmethod
    @torch.autograd.function.once_differentiable  # X is not autograd's gradient of the spectrum: not differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        u, kernel_spectrum = ctx.saved_tensors
        n, L = fft_size(2 * u.shape[-1] - 1), u.shape[-1]
        g = torch.fft.rfft(grad, n=n)  # B x C x H x (n/2 + 1), or B x 2 x C x H/2 x (n/2 + 1)
        grad_u = grad_spectrum = None
        if ctx.needs_input_grad[0]:
            grad_u = torch.fft.irfft((g * kernel_spectrum.conj()).sum(-3), n=n)[..., :L].reshape(u.shape)
        if ctx.needs_input_grad[1]:
            grad_spectrum = (g * _input_spectrum(u, n, ctx.two_way).conj()).sum(0)  # C x H x F, or 2 x C x H/2 x F
            if ctx.two_way:
                grad_spectrum[1].imag.neg_()
        return grad_u, grad_spectrum, None


class _KernelSpectrum(torch.autograd.Function):
    """``rfft(causal, n) + conj(rfft(anticausal, n))`` of the ``C x H x L`` kernels that are given
    (``_kernel_spectrum``); backward from ``_SpectralConvolution``'s ``X``: ``irfft(X)[:L]`` and
    ``irfft(conj X)[:L]``."""

    @staticmethod
    def forward(ctx, causal: Tensor | None, anticausal: Tensor | None, n: int) -> Tensor:
        ctx.n, ctx.L = n, (causal if causal is not None else anticausal).shape[-1]
        return _kernel_spectrum(causal, anticausal, n)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, x: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        grad_causal = torch.fft.irfft(x, n=ctx.n)[..., :ctx.L] if ctx.needs_input_grad[0] else None
        grad_anticausal = torch.fft.irfft(x.conj(), n=ctx.n)[..., :ctx.L] if ctx.needs_input_grad[1] else None
        return grad_causal, grad_anticausal, None


class _TwoWaySpectra(torch.autograd.Function):
    """The two-way spectra of ``... x 2 x C x H x L`` taps (direction 0 causal, 1 anti-causal): ``rfft(taps, n)``,
    direction 1 conjugated in place, ``... x 2 x C x H x (n/2 + 1)``. Backward from ``_SpectralConvolution``'s ``X``
    (direction 1 already conjugated there): ``irfft(X)[:L]``, one inverse FFT for all stages and both directions."""

    @staticmethod
    def forward(ctx, taps: Tensor, n: int) -> Tensor:
        ctx.n, ctx.L = n, taps.shape[-1]
        spectrum = torch.fft.rfft(taps, n=n)
        spectrum.select(-4, 1).imag.neg_()
        return spectrum

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, x: Tensor) -> tuple[Tensor, None]:
        return torch.fft.irfft(x, n=ctx.n)[..., :ctx.L], None


def _input_spectrum(u: Tensor, n: int, two_way: bool) -> Tensor:
    """``rfft(u, n)`` of ``B x H x L`` inputs as ``B x 1 x H x F``, or two-way as ``B x 2 x 1 x H/2 x F``."""
    if two_way:
        return torch.fft.rfft(u.view(u.shape[0], 2, 1, u.shape[1] // 2, u.shape[2]), n=n)
    return torch.fft.rfft(u, n=n).unsqueeze(1)


def _kernel_spectrum(causal: Tensor | None, anticausal: Tensor | None, n: int) -> Tensor:
    """``rfft(causal, n) + conj(rfft(anticausal, n))`` of the kernels that are given."""
    spectra = [torch.fft.rfft(causal, n=n)] if causal is not None else []
    if anticausal is not None:
        spectra.append(torch.fft.rfft(anticausal, n=n).conj())
    return spectra[0] if len(spectra) == 1 else spectra[0] + spectra[1]


def _spectral_conv(x: Tensor, causal: Tensor | None, anticausal: Tensor | None) -> Tensor:
    """``x`` (``B x H x L``) convolved with the causal and/or anti-causal ``C x H x L`` taps: ``B x C x H x L``."""
    spectrum = _KernelSpectrum.apply(causal, anticausal, fft_size(2 * x.shape[-1] - 1))
    return _SpectralConvolution.apply(x, spectrum, False)


def _first_taps(K: Tensor, L: int) -> Tensor:
    """``K[..., :L]``, without a slice (whose backward pass copies into zeros) where ``K`` has ``L`` taps."""
    return K if K.shape[-1] == L else K[..., :L]


def _taps(K: Tensor, L: int, dtype: torch.dtype, D: Tensor | None = None) -> Tensor:
    """The first ``L`` taps of ``K`` in ``dtype``, with the skip ``D`` added to tap 0 (``D u`` is lag 0's term).

    ``D`` is padded to ``L`` taps and added (two operators, whose backward passes are a slice and nothing), not
    written into tap 0 (whose backward pass would copy the gradient into zeros twice)."""
    k = _first_taps(K, L).to(dtype)
    if D is None:
        return k
    return k + F.pad(D.to(dtype).unsqueeze(-1), (0, L - 1))


def masked_input(u: Tensor, padding_mask: Tensor | None) -> Tensor:
    """``u`` in the compute dtype with its padded positions zeroed."""
    u = u.to(compute_dtype(u))
    if padding_mask is not None:
        u = u.masked_fill(padding_mask.unsqueeze(1), 0.0)
    return u


def masked_output(y: Tensor, padding_mask: Tensor | None, dtype: torch.dtype) -> Tensor:
    """``B x ... x L`` outputs (``B x C x H x L``) with their padded positions zeroed, in ``dtype``."""
    if padding_mask is not None:
        y = y.masked_fill(padding_mask.reshape(y.shape[0], *[1] * (y.dim() - 2), y.shape[-1]), 0.0)
    return y.to(dtype)


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
    x = masked_input(u, padding_mask)
    k = _taps(K, x.shape[-1], x.dtype, D)
    y = _spectral_conv(x, None, k) if reverse else _spectral_conv(x, k, None)
    return masked_output(y, padding_mask, u.dtype)


Stage = tuple[tuple[Tensor, Tensor | None], tuple[Tensor, Tensor | None]]  # ((K, D) causal, (K, D) anti-causal)


def two_way_spectra(stages: list[Stage], L: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """What ``two_way_fft_conv`` multiplies the spectrum of length-``L`` inputs by, for each of ``stages`` (each its
    causal and anti-causal ``(K, D)``: ``C x H x L'`` kernels, ``C x H`` skips or None, as in ``two_way_fft_conv``):
    ``S x 2 x C x H x (n/2 + 1)`` complex (``n = fft_size(2 L - 1)``), each causal kernel's spectrum and each
    anti-causal one's conjugate, skips included, all in one FFT (and in the backward pass one inverse FFT), not one per
    stage (``shared_spectrum=`` of ``two_way_fft_conv``). It depends on the kernels and ``L`` only: inference keeps each
    stage's (``two_way_spectrum``, ``spectrum=`` of ``two_way_fft_conv``). ``dtype``: the inputs' dtype; the spectra
    are in their compute dtype (float64 for float64, else float32: half precision inputs are convolved in float32, as
    ``masked_input`` casts them)."""
    dtype = torch.float64 if dtype == torch.float64 else torch.float32
    K = torch.stack([_first_taps(K, L) for stage in stages for K, _ in stage])  # (S 2) x C x H x L
    skips = [D for stage in stages for _, D in stage]
    D = None if skips[0] is None else torch.stack(skips)
    taps = _taps(K, L, dtype, D)
    return _TwoWaySpectra.apply(taps.view(len(stages), 2, *taps.shape[1:]), fft_size(2 * L - 1))


def two_way_spectrum(causal: tuple[Tensor, Tensor | None], anticausal: tuple[Tensor, Tensor | None], L: int,
                     dtype: torch.dtype = torch.float32) -> Tensor:
    """``two_way_spectra`` of one stage: ``2 x C x H x (n/2 + 1)``."""
    return two_way_spectra([(causal, anticausal)], L, dtype)[0]


def two_way_fft_conv(
    u: Tensor, causal: tuple[Tensor, Tensor | None] | None = None,
    anticausal: tuple[Tensor, Tensor | None] | None = None, padding_mask: Tensor | None = None,
    spectrum: Tensor | None = None, shared_spectrum: Tensor | None = None,
) -> Tensor:
    """The first half of the channels convolved causally, the second anti-causally, in one FFT pair.

    Equals ``torch.stack([fft_conv(u1, *causal, padding_mask), fft_conv(u2, *anticausal, padding_mask,
    reverse=True)], dim=1)`` for ``u = cat([u1, u2], dim=1)``: the two directions of a bidirectional block as one
    convolution, each direction's outputs contiguous. Padded positions are zeroed on input, so they never reach a
    real position, and on output (that zeroing is also the compact copy of the inverse FFT's first ``L`` of ``n``
    positions which an activation keeps for the backward pass); with a kept ``spectrum`` (inference, nothing kept for
    a backward pass) the outputs at padded positions are not zeroed: in a stack of stages the next stage zeroes them
    on its input, one masking per stage instead of two.

    The kernels' spectrum comes from one of three places: ``causal`` and ``anticausal``, ``(K, D)`` of each half
    (``C x H x L'`` kernels and ``C x H`` skips, both or neither with a skip); ``spectrum``, the ``two_way_spectrum``
    of this stage at length ``L`` kept by the caller (inference only: no gradient reaches the kernels through it; with
    the kernels given too they are checked, not transformed); or ``shared_spectrum``, this stage's
    ``two_way_spectra(stages, L)[s]``, the spectra of several stages computed in one FFT, with autograd where their
    kernels have it (a spectrum with a gradient must come from ``two_way_spectra``: what flows back to it is that
    function's own form of the kernels' gradient, not autograd's gradient of a complex tensor).

    Args:
        u: ``B x 2H x L``.
        padding_mask: ``B x L``, True at padded positions (zeroed on input and, without a kept ``spectrum``, on output).
    Returns:
        ``B x 2 x C x H x L`` in the dtype of ``u``.
    """
    kernels_given = [kernels is not None for kernels in (causal, anticausal)]
    one_source = sum([all(kernels_given) and spectrum is None, spectrum is not None, shared_spectrum is not None]) == 1
    with_shared = shared_spectrum is not None and any(kernels_given)
    if any(kernels_given) != all(kernels_given) or with_shared or not one_source:
        raise ValueError("two_way_fft_conv needs exactly one of: the kernels of both halves, a kept spectrum (the "
                         "kernels may be given with it) or a shared spectrum")
    if u.dim() != 3 or u.shape[1] % 2:
        raise ValueError(f"u must have shape (batch, 2H, length) with an even number of channels, got {tuple(u.shape)}")
    H = u.shape[1] // 2
    check_input(u, 2 * H)
    if padding_mask is not None and padding_mask.shape != (u.shape[0], u.shape[2]):
        raise ValueError(f"padding_mask must have shape ({u.shape[0]}, {u.shape[2]}), got {tuple(padding_mask.shape)}")
    x = masked_input(u, padding_mask)
    L = x.shape[-1]
    if all(kernels_given):
        for K, D in (causal, anticausal):
            _check_kernel(u[:, :H], K, D, padding_mask)
        if spectrum is None and shared_spectrum is None:
            shared_spectrum = two_way_spectrum(causal, anticausal, L, x.dtype)
    given_spectrum = shared_spectrum if spectrum is None else spectrum
    F_ = fft_size(2 * L - 1) // 2 + 1
    if given_spectrum.dim() != 4 or given_spectrum.shape[0] != 2 or given_spectrum.shape[2:] != (H, F_):
        raise ValueError(f"the spectrum of length-{L} inputs of {2 * H} channels must have shape (2, C, {H}, {F_}), "
                         f"got {tuple(given_spectrum.shape)}")
    if spectrum is not None:
        tensors = [u, spectrum, *(t for kernels in (causal, anticausal) if kernels for t in kernels if t is not None)]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            raise ValueError("a kept spectrum is for inference: with autograd the kernels' gradients need their taps")
        n = fft_size(2 * L - 1)
        return torch.fft.irfft(_input_spectrum(x, n, True) * spectrum, n=n)[..., :L].to(u.dtype)
    checked = not torch.compiler.is_compiling()  # a traced graph has no autograd history to follow
    if checked and shared_spectrum.requires_grad and not _from_two_way_spectra(shared_spectrum):
        raise ValueError("a shared spectrum with autograd must come from two_way_spectra (a stage of its result)")
    y = _SpectralConvolution.apply(x, shared_spectrum, True)
    return masked_output(y, padding_mask, u.dtype)


def _from_two_way_spectra(spectrum: Tensor) -> bool:
    """Whether ``spectrum``'s autograd history is ``two_way_spectra``'s transform, through indexing only."""
    node = spectrum.grad_fn
    while node is not None and node.name() in ("UnbindBackward0", "SelectBackward0", "SliceBackward0"):
        node = node.next_functions[0][0]
    return type(node) is _TwoWaySpectra._backward_cls


def bidirectional_fft_conv(
    u: Tensor, K_forward: Tensor, K_backward: Tensor, D: Tensor | None = None, padding_mask: Tensor | None = None
) -> Tensor:
    """Sum of a causal and an anti-causal convolution, in one FFT pass.

    ``y = fft_conv(u, K_forward) + fft_conv(u, K_backward, reverse=True) + D u``; shapes as in ``fft_conv``.
    """
    _check_kernel(u, K_forward, D, padding_mask)
    _check_kernel(u, K_backward, None, padding_mask)
    x = masked_input(u, padding_mask)
    L = x.shape[-1]
    y = _spectral_conv(x, _taps(K_forward, L, x.dtype, D), _taps(K_backward, L, x.dtype))
    return masked_output(y, padding_mask, u.dtype)
