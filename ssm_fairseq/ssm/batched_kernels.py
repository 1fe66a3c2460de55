"""Several MSSM kernels generated in one call, as one kernel with their heads side by side.

A bidirectional MSSM layer owns four kernels (two directions, two stages); each is a handful of small
operations (``eigh`` of its ``heads x N x N`` state matrices, the discretisation, the Vandermonde product) whose
cost on a GPU is the launching of operations, not arithmetic. The heads of an
MSSM kernel are independent, so kernels of the same configuration are one kernel with all their heads: their
parameters are concatenated along the head and channel dimensions, the merged kernel is generated once
(``MSSMKernel.taps`` of the concatenated parameters: gradients reach each kernel's own parameters through the
concatenation), and its ``C x (n H) x L`` output is split back; each ``D`` is its kernel's own. The result equals the
kernels generated one by one (tested), with a quarter of the operations for four kernels.

Layers call ``layer_kernels``, which generates a layer's kernels of one configuration together; an encoder opens
``generated_together`` around its layers, so that the kernels of several layers (every layer, both directions, all
stages) are one generation: the ``mssm_transducer`` encoder's training step at 2 s then dispatches 5251 operators
instead of 8165 with one generation per layer (``scripts/benchmarks/op_count.py``). On a GPU (``BATCHED_DEVICES``) a
generation holds every kernel of a configuration. Elsewhere (a CPU) its size is bounded: the transients of a batched
generation (the merged kernel, and in the backward pass the gradients of all its kernels and the transposed
Vandermonde products) grow with the kernels batched, and batching the whole ``mssm_transducer`` encoder (its layers'
64 kernels in one generation, its sub-sampler's 24 in two) at 10 s raised its peak training memory from 188 to 671 MiB.
So on a CPU consecutive layers' kernels are generated in groups of at most ``GENERATION_BYTES`` (``generation_groups``),
each when its first kernel is needed and freed once its layers have taken their kernels: two generations for the
encoder at 2 s, eight at 10 s, where the training step's peak memory is 13% above one kernel at a time. On CPU
(``CHUNKED_DEVICES``), from ``CHUNKED_MIN_POSITIONS`` positions in a batch (its sequences times their padded length),
an MSSM kernel is not generated at all: ``layer_kernels`` gives it as a ``ChunkedKernel``, which the layers convolve
chunk by chunk in matrix products (``chunked_conv.py``).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, NamedTuple

import torch
from torch import Tensor, nn

from .chunked_conv import default_chunk
from .mssm_kernel import MSSMKernel

# devices on which a generation holds every kernel of a configuration however many (where launching an operation
# costs more than its arithmetic); elsewhere (a CPU) a generation holds at most GENERATION_BYTES of kernels
BATCHED_DEVICES = ("cuda",)
# on devices outside BATCHED_DEVICES, the bytes of ``C x H x L`` kernels one generation may give: its transients (the
# power tables of the Vandermonde product, about four times its kernels' bytes at 250 positions, and in the backward
# pass the gradients of all its kernels and the transposed products) grow with it. The ``mssm_transducer`` encoder's
# training step at 10 s (64 kernels of 1 MiB, 88 with the sub-sampler's): peak 264 MiB one kernel at a time, 271 /
# 298 / 352 MiB with generations of 4 / 8 / 16 MiB; at 2 s its 64 kernels (12.5 MiB) are 2 generations at 8 MiB
# (3755 operators a step) and 1 at 16 MiB (3601) (docs/benchmarks.md, "What a step launches")
GENERATION_BYTES = 8 * 2**20
# devices on which MSSM kernels are convolved chunk by chunk from their diagonal systems: where matrix products run
# faster than FFTs (scripts/benchmarks/chunked_conv.py). One convolution of 1024 channels (C = 2), forward + backward,
# batch 1: on a 2-core CPU, FFT 22 / 55 / 591 / 2503 ms at 256 / 1k / 4k / 16k positions, chunk by chunk 29 / 60 / 269
# / 986; on an NVIDIA H200 the FFT is 1.4-4x faster at 4k-64k (4.6 against 17.4 ms at 4k), though twice as large
CHUNKED_DEVICES = ("cpu",)
# the fewest positions of a batch (sequences times padded length) convolved chunk by chunk: a width-512 MSSM layer on
# a 2-core CPU is faster that way from about 2,000, in training and inference, at any length from 50 to 2,000 frames
# (one sequence of 2,000 as well as 200 of 50), about as fast at 1,000 and slower at 400 (``chunked_conv.py
# --layer``, docs/benchmarks.md)
CHUNKED_MIN_POSITIONS = 2000
# dimension of each MSSMKernel parameter along which heads (z_lambda, p, B) or channels (C, z_dt) lie (each D is
# its kernel's own: not concatenated)
_STACKING_DIMS = {"z_lambda": 0, "p": 0, "B": 0, "C": 1, "z_dt": 0}


class ChunkedKernel(NamedTuple):
    """An MSSM kernel to be convolved chunk by chunk in chunks of ``chunk`` positions, from its ``chunk_matrices`` (kept
    in inference), instead of being generated (``chunked_conv``: ``chunk_convolution`` channels first in inference,
    ``convolve_batch_first`` in training)."""

    kernel: MSSMKernel
    chunk: int


class _Generation:
    """Kernels of one configuration generated in one call at length ``L`` when the first of them is needed, each
    kernel's result given once (``take``), then dropped: the merged kernel is freed once every layer has taken its
    share, so that one generation's kernels are held at a time, not the whole encoder's."""

    def __init__(self, kernels: list[MSSMKernel], L: int):
        self.kernels, self.L = kernels, L
        self.results: dict[int, tuple[Tensor, Tensor]] | None = None

    def take(self, kernel: MSSMKernel) -> tuple[Tensor, Tensor] | None:
        """``kernel(L)`` from the generation (run now if it has not yet), or None if it was already taken."""
        if self.results is None:
            self.results = {id(k): generated for k, generated in zip(self.kernels, batched_kernels(self.kernels, self.L))}
        return self.results.pop(id(kernel), None)


# id(kernel) -> (kernel, its _Generation) while a generated_together context is open (the kernel is held so that its id
# is not reused); a context variable, so that forward passes in other threads neither see nor release them
_GENERATED: contextvars.ContextVar[dict[int, tuple[MSSMKernel, _Generation]]] = contextvars.ContextVar(
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


def _chunked(kernels: list, L: int, batch: int) -> bool:
    return bool(kernels) and kernels[0].D.device.type in CHUNKED_DEVICES and batch * L >= CHUNKED_MIN_POSITIONS


def generation_groups(kernels: list, L: int) -> list[list]:
    """``kernels`` (in order) split into the groups generated together at length ``L``: MSSM kernels by
    configuration, each group in the order of its first kernel; on devices outside ``BATCHED_DEVICES`` a group is cut
    where its ``C x H x L`` kernels would exceed ``GENERATION_BYTES`` (a single kernel larger than that is a group of
    its own). Kernels of other types are groups of one."""
    groups, open_groups = [], {}  # signature -> the group being filled
    for kernel in kernels:
        if type(kernel) is not MSSMKernel:
            groups.append([kernel])
            continue
        signature = _signature(kernel)
        group = open_groups.get(signature)
        if group is not None and kernel.D.device.type not in BATCHED_DEVICES:
            size = kernel.out_channels * kernel.channels * L * kernel.D.element_size() * (len(group) + 1)
            if size > GENERATION_BYTES:
                group = None
        if group is None:
            group = open_groups[signature] = []
            groups.append(group)
        group.append(kernel)
    return groups


def layer_kernels(kernels: list, L: int, batch: int = 1) -> list[tuple[Tensor, Tensor] | ChunkedKernel]:
    """What the layers convolve with for each of ``kernels`` at ``batch`` sequences of length ``L``: ``kernel(L)``,
    those of one configuration in one batched generation (``generation_groups``: on a CPU, at most
    ``GENERATION_BYTES`` of kernels each); on the devices of ``CHUNKED_DEVICES``, from ``CHUNKED_MIN_POSITIONS``
    positions (``batch x L``), an MSSM kernel as a ``ChunkedKernel`` instead.
    Inside ``generated_together`` the kernels are taken from its generations."""
    generated = _GENERATED.get()
    results = {}
    for kernel in kernels:
        entry = generated.get(id(kernel))
        taken = entry[1].take(kernel) if entry is not None and entry[1].L == L else None
        if taken is not None:
            results[id(kernel)] = taken
    missing = [kernel for kernel in kernels if id(kernel) not in results]
    if _chunked(missing, L, batch):
        chunk = default_chunk(L, batch)
        results.update((id(k), ChunkedKernel(k, chunk) if type(k) is MSSMKernel else k(L)) for k in missing)
    elif missing:
        for group in generation_groups(missing, L):
            results.update((id(k), generated) for k, generated in zip(group, batched_kernels(group, L)))
    return [results[id(kernel)] for kernel in kernels]


@contextlib.contextmanager
def generated_together(module: nn.Module, L: int, batch: int = 1) -> Iterator[None]:
    """While open, ``layer_kernels`` gives the MSSM kernels inside ``module`` (every layer of an encoder, both
    directions, all stages) at length ``L`` from batched generations (``generation_groups``: one per configuration on
    a GPU; on a CPU, groups of consecutive layers' kernels of at most ``GENERATION_BYTES``), with autograd: a few
    generations per forward pass, not one per layer (none where ``batch`` sequences of length ``L`` are convolved chunk
    by chunk). Each generation runs when its first kernel is needed (so that one
    generation's kernels are held at a time, not the whole encoder's); each kernel's result is given once."""
    kernels = [m for m in module.modules() if type(m) is MSSMKernel]
    held = dict(_GENERATED.get())  # a new dict: the default and an enclosing context's stay as they are
    if kernels and not _chunked(kernels, L, batch) and (kernels[0].training or torch.is_grad_enabled()):
        for group in generation_groups(kernels, L):  # groups of one too: no layer then regenerates its other kernels
            generation = _Generation(group, L)
            held.update((id(k), (k, generation)) for k in group)
    token = _GENERATED.set(held)
    try:
        yield
    finally:
        _GENERATED.reset(token)


class _ChannelsMerged(torch.autograd.Function):
    """``torch.cat(parts, dim=1)`` of ``C x H x N`` tensors whose backward pass gives each part's gradient contiguous.

    The gradient of a part of a concatenation along dimension 1 is a strided slice, which autograd then copies into a
    contiguous gradient for each parameter (one operator per kernel: 88 per training step of the ``mssm_transducer``
    encoder). Here one copy rearranges the whole gradient (``C x (n H) x N`` -> ``n x C x H x N``), whose ``n`` parts
    are contiguous and become the parameters' gradients as they are."""

    @staticmethod
    def forward(ctx, *parts: Tensor) -> Tensor:
        ctx.count = len(parts)
        return torch.cat(parts, dim=1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, ...]:
        C, _, N = grad.shape
        return grad.reshape(C, ctx.count, -1, N).transpose(0, 1).contiguous().unbind(0)


def _merged(parts: list[Tensor], dim: int) -> Tensor:
    """``parts`` concatenated along ``dim`` (0 or 1, ``_STACKING_DIMS``), each part's gradient contiguous."""
    return torch.cat(parts, dim=0) if dim == 0 else _ChannelsMerged.apply(*parts)


def batched_kernels(kernels: list[MSSMKernel], L: int) -> list[tuple[Tensor, Tensor]]:
    """``[kernel(L) for kernel in kernels]`` (each ``K``: ``C x H x L``, ``D``: ``C x H``) in one generation: the
    kernels' parameters concatenated along their heads and channels (``_STACKING_DIMS``), one ``MSSMKernel.taps``,
    its ``K`` split back (each ``D`` is its kernel's own). Kernels that ``can_batch`` rejects are generated one by
    one."""
    if not can_batch(kernels):
        return [kernel(L) for kernel in kernels]
    first = kernels[0]
    first.check_length(L)
    with torch.autocast(device_type=first.D.device.type, enabled=False):
        merged = [_merged([first.real(getattr(k, name)) for k in kernels], dim) for name, dim in _STACKING_DIMS.items()]
        K = MSSMKernel.taps(*merged, L)
    return [(taps, kernel.real(kernel.D)) for taps, kernel in zip(K.split(first.channels, dim=1), kernels)]
