"""Several MSSM kernels generated in one call, as one kernel with their heads side by side.

A bidirectional MSSM layer owns four kernels (two directions, two stages); each is a handful of small
operations (``eigh`` of its ``heads x N x N`` state matrices, the discretisation, the Vandermonde product) whose
cost on a GPU is the launching of operations, not arithmetic. The heads of an
MSSM kernel are independent, so kernels of the same configuration are one kernel with all their heads: their
parameters are concatenated along the head and channel dimensions, the merged kernel is generated once
(``torch.func.functional_call`` on a template of the merged shape, so gradients reach each kernel's own
parameters through the concatenation), and its ``C x (n H) x L`` output is split back. The result equals the
kernels generated one by one (tested), with a quarter of the operations for four kernels.

Layers call ``layer_kernels``, which batches on a GPU only (``BATCHED_DEVICES``): on CPU, where an operation's
launch costs little, batching saved no measurable time and raised a 4-layer MSSM encoder's peak training memory
at 10 s from 47 to 62 MiB (a transient of the batched path: what the backward pass keeps is the same). On CPU
(``CHUNKED_DEVICES``), from ``CHUNKED_MIN_LENGTH`` positions, an MSSM kernel is not generated at all:
``layer_kernels`` gives its discrete diagonal system, which ``convolve`` runs chunk by chunk in matrix products
(``chunked_conv.py``).
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.func import functional_call

from .chunked_conv import DiagonalSystem, chunked_diagonal_conv
from .fft_conv import fft_conv
from .mssm_kernel import MSSMKernel

# devices on which layer_kernels batches (where launching an operation costs more than its arithmetic)
BATCHED_DEVICES = ("cuda",)
# devices on which MSSM kernels are convolved chunk by chunk from their diagonal systems: where matrix products run
# faster than FFTs (scripts/benchmarks/chunked_conv.py). One convolution of 1024 channels (C = 2), forward + backward:
# on a 2-core CPU, FFT 22 / 55 / 591 / 2503 ms at 256 / 1k / 4k / 16k positions, chunk by chunk 29 / 60 / 269 / 986;
# on an NVIDIA H200 the FFT is 1.4-4x faster at 4k-64k (4.6 against 17.4 ms at 4k), though twice as large
CHUNKED_DEVICES = ("cpu",)
# the shortest sequence convolved chunk by chunk (from the CPU figures above)
CHUNKED_MIN_LENGTH = 2048
# dimension of each MSSMKernel parameter along which heads (z_lambda, p, B) or channels (C, D, z_dt) lie
_STACKING_DIMS = {"z_lambda": 0, "p": 0, "B": 0, "C": 1, "D": 1, "z_dt": 0}


def _signature(kernel: MSSMKernel) -> tuple:
    return (kernel.channels, kernel.state_size, kernel.out_channels, kernel.heads, kernel.D.dtype, kernel.D.device)


def can_batch(kernels: list) -> bool:
    """Whether ``kernels`` are two or more ``MSSMKernel`` of one configuration that need generating with autograd
    (in inference each kernel keeps its own cached kernel, which batching would bypass)."""
    if len(kernels) < 2 or not all(type(k) is MSSMKernel for k in kernels):
        return False
    if not (kernels[0].training or torch.is_grad_enabled()):
        return False
    return len({_signature(k) for k in kernels}) == 1


def layer_kernels(kernels: list, L: int) -> list[tuple[Tensor, Tensor] | DiagonalSystem]:
    """What ``convolve`` needs of each of ``kernels`` at length ``L``: ``kernel(L)``, in one batched generation on the
    devices of ``BATCHED_DEVICES``; on those of ``CHUNKED_DEVICES``, from ``CHUNKED_MIN_LENGTH`` positions, an MSSM
    kernel's ``DiagonalSystem`` instead."""
    device = kernels[0].D.device.type if kernels else None
    if device in BATCHED_DEVICES:
        return batched_kernels(kernels, L)
    if device in CHUNKED_DEVICES and L >= CHUNKED_MIN_LENGTH:
        return [kernel.chunkable_system(L) if type(kernel) is MSSMKernel else kernel(L) for kernel in kernels]
    return [kernel(L) for kernel in kernels]


def convolve(u: Tensor, kernel: tuple[Tensor, Tensor] | DiagonalSystem, padding_mask: Tensor | None = None,
             reverse: bool = False) -> Tensor:
    """``u`` (``B x H x L``) convolved with one of ``layer_kernels``' results: ``B x C x H x L`` (``fft_conv`` of a
    ``(K, D)`` kernel, ``chunked_diagonal_conv`` of a ``DiagonalSystem``)."""
    if isinstance(kernel, DiagonalSystem):
        return chunked_diagonal_conv(u, *kernel, padding_mask=padding_mask, reverse=reverse)
    K, D = kernel
    return fft_conv(u, K, D, padding_mask, reverse=reverse)


def batched_kernels(kernels: list[MSSMKernel], L: int) -> list[tuple[Tensor, Tensor]]:
    """``[kernel(L) for kernel in kernels]`` (each ``K``: ``C x H x L``, ``D``: ``C x H``) in one generation.

    Kernels that ``can_batch`` rejects are generated one by one.
    """
    if not can_batch(kernels):
        return [kernel(L) for kernel in kernels]
    first, n = kernels[0], len(kernels)
    template = _template(n * first.channels, first.state_size, first.out_channels, n * first.heads)
    merged = {name: torch.cat([getattr(k, name) for k in kernels], dim=dim) for name, dim in _STACKING_DIMS.items()}
    K, D = functional_call(template, merged, (L,), strict=True)
    return list(zip(K.split(first.channels, dim=1), D.split(first.channels, dim=1)))


@functools.lru_cache(maxsize=None)
def _template(channels: int, state_size: int, out_channels: int, heads: int) -> MSSMKernel:
    """An MSSM kernel of the merged shape on the meta device: ``functional_call`` replaces all its parameters,
    so only its shapes and settings are used. Built without drawing from the random generator, so that a run
    that builds it later (resumed from a checkpoint) draws the same dropout masks as one that built it earlier."""
    with torch.device("meta"):
        return MSSMKernel(channels, state_size, out_channels, heads=heads)
