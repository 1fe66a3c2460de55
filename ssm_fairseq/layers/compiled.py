"""Opt-in ``torch.compile`` of encoder layers, with their modules and state dicts left as they are.

``compile_layers(layers)`` gives each layer (any module called as ``layer(x, padding_mask)`` on ``B x L x D`` inputs
with a ``B x L`` padding mask, True at padded frames: ``EncoderLayer``) a compiled ``forward``: an attribute of the
instance, not a wrapping module, so parameter names, ``state_dict`` keys and checkpoints are those of the eager
model (a checkpoint loads into either), and ``layer.step`` (streaming) stays eager. ``uncompile_layers`` removes it.
The default backend is inductor (on a CPU it generates C++ and needs a C++ compiler, gcc; on a GPU, Triton).

Shapes. Inductor specialises a graph to its sequence length (the layers' FFT sizes and kernel lengths are computed
from it in Python), and dynamo stops compiling a function after a few shapes (its ``recompile_limit``), silently
running it eagerly from then on. Fairseq's batches have a new length at almost every step, so, unless
``bucket_lengths=False``:

* the batch dimension is compiled as dynamic (one graph for every batch size above 1);
* each batch is padded up to the next *bucket* length (``bucket_length``: ``2^a`` or ``3 * 2^(a-1)``, at least
  ``MIN_BUCKET``; LibriSpeech's 1-35 s utterances, 25-875 frames at 40 ms per frame, fall in 10 buckets), the added
  frames marked as padding, and the layer's output cut back to the batch's length. Padded frames never reach real
  ones in any layer type (masked attention keys, masked SSM inputs and outputs in both directions, zeroed
  convolution inputs, per-frame norms and feed-forwards), so the real frames' outputs are the eager layer's, to float
  rounding. Two things do see the padding, as they already see a batch's own padding in eager mode: a Conformer
  layer's BatchNorm statistics in training, and the positions at which dropout draws its masks (a different draw,
  not a different distribution). The padded frames cost time: over lengths spread evenly from 100 to 1000 frames,
  19% more frames on average;
* dynamo's ``recompile_limit`` is raised to ``RECOMPILE_LIMIT`` (a process-wide setting), so that buckets, training
  and inference, and the layers' nested functions (kernel generation, compiled per length) stay compiled.

Compilation happens at the first call of each shape, and costs minutes at full size on a CPU (reported by
``scripts/benchmarks/encoders.py --compiled``); eager stays the default everywhere.
"""
from __future__ import annotations

import copy
import types

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# the shortest bucket: shorter batches are padded up to it
MIN_BUCKET = 16
# dynamo's per-function limit on compiled variants while compiled layers exist (torch's default is 8)
RECOMPILE_LIMIT = 64


def bucket_length(length: int) -> int:
    """The bucket a sequence of ``length`` frames is padded to: the smallest ``2^a`` or ``3 * 2^(a-1)`` (16, 24, 32,
    48, 64, ...) that is at least ``length`` and ``MIN_BUCKET`` (the padding is less than a third of the bucket)."""
    if length < 1:
        raise ValueError(f"a sequence length must be positive, got {length}")
    length = max(length, MIN_BUCKET)
    power_of_two = 1 << (length - 1).bit_length()
    three_halves = 3 * power_of_two // 4  # 3 * 2^(a-2) for power_of_two = 2^a
    return three_halves if three_halves >= length else power_of_two


class CompiledForward:
    """A layer's compiled ``forward(x, padding_mask)``, held as an instance attribute of the layer (see the module
    docstring): ``x``: ``B x L x D``, ``padding_mask``: ``B x L`` (True at padded frames) or None. Returns
    ``B x L x D``."""

    def __init__(self, layer: nn.Module, bucket_lengths: bool, options: dict):
        self.eager = types.MethodType(type(layer).forward, layer)  # the class's forward, bound to the layer
        self.compiled = torch.compile(self.eager, **options)
        self.bucket_lengths, self.options = bucket_lengths, options

    def __deepcopy__(self, memo: dict) -> CompiledForward:
        """The copy of a compiled layer (``copy.deepcopy`` of a model: fairseq's ``--ema``) runs the copy's own
        forward, compiled alike (a copied ``torch.compile`` result would run the original layer)."""
        return CompiledForward(copy.deepcopy(self.eager.__self__, memo), self.bucket_lengths, self.options)

    def __call__(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        if not self.bucket_lengths:
            return self.compiled(x, padding_mask)
        B, L, _ = x.shape
        bucket = bucket_length(L)
        if padding_mask is None:
            padding_mask = torch.zeros(B, L, dtype=torch.bool, device=x.device)
        if bucket > L:
            x = F.pad(x, (0, 0, 0, bucket - L))
            padding_mask = F.pad(padding_mask, (0, bucket - L), value=True)
        torch._dynamo.maybe_mark_dynamic(x, 0)  # one graph for all batch sizes (a batch of 1 still gets its own)
        torch._dynamo.maybe_mark_dynamic(padding_mask, 0)
        return self.compiled(x, padding_mask)[:, :L]


def compile_layers(layers: nn.Module | list[nn.Module], bucket_lengths: bool = True, **options) -> None:
    """Compile each of ``layers`` (an ``nn.ModuleList`` or a list of layers) in place: its ``forward`` becomes a
    ``CompiledForward``; ``options`` go to ``torch.compile`` (``backend``, ``mode``, ...). Layers of one class and
    shape share their compiled graphs (parameters are graph inputs). Compiling again replaces the compiled forward."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    for layer in layers:
        uncompile_layers([layer])
        layer.forward = CompiledForward(layer, bucket_lengths, options)


def uncompile_layers(layers: nn.Module | list[nn.Module]) -> None:
    """Give each of ``layers`` its eager ``forward`` back (nothing happens to a layer that is not compiled)."""
    for layer in layers:
        if isinstance(layer.__dict__.get("forward"), CompiledForward):
            del layer.forward


def is_compiled(layer: nn.Module) -> bool:
    """Whether ``compile_layers`` compiled ``layer``."""
    return isinstance(layer.__dict__.get("forward"), CompiledForward)
