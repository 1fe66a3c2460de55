"""Several MSSM kernels generated in one call, as one kernel with their heads side by side.

A bidirectional MSSM layer owns four kernels (two directions, two stages); each is a handful of small
operations (``eigh`` of its ``heads x N x N`` state matrices, the discretisation, the Vandermonde product) whose
cost on a GPU is the launching of operations, not arithmetic. The heads of an
MSSM kernel are independent, so kernels of the same configuration are one kernel with all their heads: their
parameters are concatenated along the head and channel dimensions, the merged kernel is generated once
(``torch.func.functional_call`` on a template of the merged shape, so gradients reach each kernel's own
parameters through the concatenation), and its ``C x (n H) x L`` output is split back. The result equals the
kernels generated one by one (tested), with a quarter of the operations for four kernels.

Layers call ``layer_kernels``, which batches on a GPU only (``BATCHED_DEVICES``); an encoder opens
``generated_together`` around its layers, so that all their kernels of one configuration (every layer, both
directions, all stages) are one generation per forward pass: the ``mssm_transducer`` encoder's training step at 2 s
then dispatches 5251 operators instead of 8165 with one generation per layer (``scripts/benchmarks/op_count.py``).
On CPU, where an operation's launch costs little, batching saved no time and costs memory: the transients of the
batched generation (the Vandermonde factors of every channel at once) grow with the kernels batched. Batching per
layer raised a 4-layer MSSM encoder's peak training memory at 10 s from 47 to 62 MiB; batching the whole
``mssm_transducer`` encoder (its layers' 64 kernels in one generation, its sub-sampler's 24 in two) at 10 s raised it
from 188 to 671 MiB and its step from 2.0 to 2.4 s (a 2-core CPU; what the backward pass keeps is the same). The
transient does not grow with the batch of utterances, so on a GPU it is a fixed few hundred MiB. On CPU
(``CHUNKED_DEVICES``), from ``CHUNKED_MIN_LENGTH`` positions, an MSSM kernel is not generated at all:
``layer_kernels`` gives its discrete diagonal system, which ``convolve`` runs chunk by chunk in matrix products
(``chunked_conv.py``).
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
from typing import Iterator

import torch
from torch import Tensor, nn
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
# id(kernel) -> (kernel, L, its kernel(L)) while a generated_together context is open (the kernel is held so that its
# id is not reused); a context variable, so that forward passes in other threads neither see nor release them
_GENERATED: contextvars.ContextVar[dict[int, tuple[MSSMKernel, int, tuple[Tensor, Tensor]]]] = contextvars.ContextVar(
    "generated_kernels", default={})


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


def _chunked(kernels: list, L: int) -> bool:
    return bool(kernels) and kernels[0].D.device.type in CHUNKED_DEVICES and L >= CHUNKED_MIN_LENGTH


def _batched(kernels: list, L: int) -> bool:
    return bool(kernels) and kernels[0].D.device.type in BATCHED_DEVICES and not _chunked(kernels, L)


def layer_kernels(kernels: list, L: int) -> list[tuple[Tensor, Tensor] | DiagonalSystem]:
    """What ``convolve`` needs of each of ``kernels`` at length ``L``: ``kernel(L)``, in one batched generation on the
    devices of ``BATCHED_DEVICES``; on those of ``CHUNKED_DEVICES``, from ``CHUNKED_MIN_LENGTH`` positions, an MSSM
    kernel's ``DiagonalSystem`` instead. Inside ``generated_together`` the kernels it generated are taken from it."""
    generated = _GENERATED.get()
    if kernels and all(generated.get(id(kernel), (None, -1))[1] == L for kernel in kernels):
        return [generated[id(kernel)][2] for kernel in kernels]
    if _chunked(kernels, L):
        return [kernel.chunkable_system(L) if type(kernel) is MSSMKernel else kernel(L) for kernel in kernels]
    if _batched(kernels, L):
        return batched_kernels(kernels, L)
    return [kernel(L) for kernel in kernels]


@contextlib.contextmanager
def generated_together(module: nn.Module, L: int) -> Iterator[None]:
    """While open, ``layer_kernels`` gives the MSSM kernels inside ``module`` (every layer of an encoder, both
    directions, all stages) at length ``L`` from one batched generation per configuration, where ``layer_kernels``
    would batch them (``BATCHED_DEVICES``, with autograd): one generation per forward pass, not one per layer. The
    generated kernels are held until the context closes."""
    kernels = [m for m in module.modules() if type(m) is MSSMKernel]
    held = dict(_GENERATED.get())  # a new dict: the default and an enclosing context's stay as they are
    if _batched(kernels, L):
        by_configuration = collections.defaultdict(list)
        for kernel in kernels:
            by_configuration[_signature(kernel)].append(kernel)
        for group in by_configuration.values():
            if can_batch(group):
                held.update((id(k), (k, L, generated)) for k, generated in zip(group, batched_kernels(group, L)))
    token = _GENERATED.set(held)
    try:
        yield
    finally:
        _GENERATED.reset(token)


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
