"""Several streams' encoder step caches as one batch: stacked along the batch dimension, stepped together, split back.

``SpeechEncoder.step`` keeps a stream's state in a nested dict (the sub-sampler's waiting frames, every SSM's
recurrence and state) whose tensors all have the stream's batch as their first dimension: a state is
``B x H x N``, a sub-sampler's waiting frames ``B x n x D``. So the caches of ``S`` one-stream encoders, at the same
point of their chunking (the same keys, tensors of the same shape past the batch dimension), stack into the cache of
one ``S``-stream step, and its result splits back into ``S`` one-stream caches:

    cache = stack_caches([cache_a, cache_b])               # tensors 1 x ... each -> 2 x ...
    out = encoder.step(torch.cat([chunk_a, chunk_b]), cache, final=False)  # 2 x m x D
    cache_a, cache_b = split_cache(cache, 2)              # 1 x ... each again

Caches stack when they have the same keys and tensors of the same shapes past the batch: ``stack_key`` is that
structure, so streams whose caches have equal keys can step together. Streams fed whole sub-sampling groups have
it whenever they have started, except under look-ahead (``lookahead.LookAhead``): its buffer fills up to ``K``
frames over a stream's first frames, and the layers' states appear with the first frame it gives.

What is not a tensor is what every stream of one model shares: a recurrence (the discrete matrices, built from the
parameters) is kept once, the first stream's; a flag (``"ended"``) must be the same in every cache. Every stream
thus steps exactly as it would alone: each row of a batched matrix product, recurrence or LayerNorm is computed
from its own row only (the batch's size may change how the arithmetic is blocked, which moves results by float
rounding, about 1e-6).

Imports only torch.
"""
from __future__ import annotations

from typing import Any, Hashable, Sequence

import torch
from torch import Tensor


class CacheMismatchError(ValueError):
    """Caches that cannot stack: different keys, tensors of different shapes past the batch, different flags."""


def stack_caches(caches: Sequence[dict]) -> dict:
    """The step caches of ``S`` streams (each of batch 1 or more) -> one cache of their batches together, in order.

    Raises ``CacheMismatchError`` naming the entry (as a path of keys) where two caches differ in structure: they
    are not at the same point of their chunking (a sub-sampler holding waiting frames in one and not the other,
    or fewer of them), or not of one model."""
    if not caches:
        raise ValueError("no caches to stack")
    return _stack(list(caches), "cache")


def _stack(values: list[Any], where: str) -> Any:
    first = values[0]
    if isinstance(first, dict):
        keys = list(first)
        for value in values[1:]:
            if not isinstance(value, dict) or value.keys() != first.keys():
                raise CacheMismatchError(f"{where}: entries {keys} and {_keys(value)} differ")
        return {key: _stack([value[key] for value in values], f"{where}[{key!r}]") for key in keys}
    if isinstance(first, list):
        if any(not isinstance(value, list) or len(value) != len(first) for value in values):
            raise CacheMismatchError(f"{where}: lists of different lengths")
        return [_stack([value[i] for value in values], f"{where}[{i}]") for i in range(len(first))]
    if isinstance(first, Tensor):
        shapes = {tuple(value.shape[1:]) if isinstance(value, Tensor) and value.dim() else None for value in values}
        if len(shapes) != 1 or None in shapes:
            raise CacheMismatchError(f"{where}: tensors of shapes {[_shape(value) for value in values]} do not stack "
                                     "along their first (batch) dimension")
        return torch.cat(values)
    if isinstance(first, (bool, int, float, str)) or first is None:
        if any(value != first for value in values):
            raise CacheMismatchError(f"{where}: values {values} differ")
        return first
    if any(type(value) is not type(first) for value in values):
        raise CacheMismatchError(f"{where}: values of types {[type(value).__name__ for value in values]}")
    return first  # a recurrence: built from the parameters, the same for every stream of the model


def stack_key(cache: dict) -> Hashable:
    """What decides whether ``cache`` stacks with another (``stack_caches``): its keys, the shapes of its tensors
    past the batch dimension and its flags, as a hashable value; equal for caches that stack."""
    return _structure(cache)


def _structure(value: Any) -> Hashable:
    if isinstance(value, dict):
        return tuple((key, _structure(item)) for key, item in value.items())
    if isinstance(value, list):
        return tuple(_structure(item) for item in value)
    if isinstance(value, Tensor):
        return "tensor", tuple(value.shape[1:])
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return type(value).__name__  # a recurrence, shared by every stream of the model


def split_cache(cache: dict, batch: int) -> list[dict]:
    """A step cache of ``batch`` streams -> ``batch`` caches of one stream each (views of its tensors' rows; the
    shared values, recurrences and flags, in each). ``ValueError`` for a tensor whose first dimension is not
    ``batch``."""
    return [_row(cache, row, batch, "cache") for row in range(batch)]


def _row(value: Any, row: int, batch: int, where: str) -> Any:
    if isinstance(value, dict):
        return {key: _row(item, row, batch, f"{where}[{key!r}]") for key, item in value.items()}
    if isinstance(value, list):
        return [_row(item, row, batch, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, Tensor):
        if not value.dim() or value.shape[0] != batch:
            raise ValueError(f"{where}: a tensor of shape {_shape(value)} in a cache of {batch} streams")
        return value[row:row + 1]
    return value


def _keys(value: Any) -> Any:
    return list(value) if isinstance(value, dict) else type(value).__name__


def _shape(value: Any) -> Any:
    return tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
