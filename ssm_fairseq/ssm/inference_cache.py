"""Values computed from a module's parameters, kept between forward passes in inference until a parameter changes.

In inference (eval mode, no autograd) what a layer derives from its parameters alone (an SSM kernel, its spectrum
at an FFT size, two directions' weights stacked) is the same at every call: decoding would pay for it once per
batch. A value is kept with the identity of the tensors it was computed from (storage, version counter, dtype,
device): an optimiser step or a loaded state dict (in-place writes: new versions), ``.to()`` or ``.half()`` (new
storages) make it stale, and it is computed again. With autograd or in train mode nothing is kept (and what was kept
is dropped), so that gradients reach the parameters. Under ``torch.compile`` nothing is kept either.
"""
from __future__ import annotations

from typing import Callable, Iterable, TypeVar

import torch
from torch import Tensor, nn

T = TypeVar("T")


def tensors_key(tensors: Iterable[Tensor]) -> tuple:
    """The identity of ``tensors`` as a cached value depends on it: storage, version counter, dtype and device."""
    return tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in tensors)


def caching(module: nn.Module) -> bool:
    """Whether ``module`` may use kept values now: in eval mode without autograd, and not while ``torch.compile``
    traces it (a compiled graph cannot key on storages; it computes the values, as eager code did before keeping)."""
    return not module.training and not torch.is_grad_enabled() and not torch.compiler.is_compiling()


def kept(module: nn.Module, name: str, tensors: Iterable[Tensor], compute: Callable[[], T],
         arguments: tuple = ()) -> T:
    """``compute()``, kept on ``module`` under ``name`` while ``caching(module)``, ``tensors`` are unchanged and
    ``arguments`` (a length, an FFT size) are the same; one value per name (other arguments replace it).

    Outside ``caching(module)`` every kept value of ``module`` is dropped and ``compute()`` returned."""
    if torch.compiler.is_compiling():
        return compute()
    entries = module.__dict__.setdefault("_inference_values", {})
    if not caching(module):
        entries.clear()
        return compute()
    key = (tensors_key(tensors), arguments)
    entry = entries.get(name)
    if entry is not None and entry[0] == key:
        return entry[1]
    entries.pop(name, None)  # the stale value is freed before the new one is computed
    value = compute()
    entries[name] = (key, value)
    return value
