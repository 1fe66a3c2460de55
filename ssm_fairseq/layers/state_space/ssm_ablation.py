"""Ablation of a trained model's state space part: the same weights with every SSM sub-layer's output zeroed.

A global layer that can be removed at no cost has learned nothing the local layers lack; evaluating a checkpoint
inside ``ssm_outputs_zeroed(model)`` measures what its SSM contributes. Zeroed are the outputs of the causal SSM
sub-layers (``CausalSSM``: SPADE's decoder global layers) and of the bidirectional SSM blocks
(``BidirectionalSSM``: SPADE's encoder global layers; also the MSSM block of an MSSM encoder layer, where it is the
layer's only mixing of positions), in ``forward`` and in a causal layer's step mode (incremental decoding). In a
SPADE global layer the merge then reads ``LN(0)``, the SSM LayerNorm's bias: a constant, so nothing of the input
reaches the merge through the SSM path.

``ssm_outputs_zeroed(model)`` ablates within a ``with`` block (the evaluation tools); ``zero_ssm_outputs(model)``
until its returned function is called (a model built with ``--ssm-ablation``, for ``fairseq-generate``).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn

from .bidirectional_ssm import BidirectionalSSM
from .causal_ssm import CausalSSM

ABLATED_SSM_TYPES = (CausalSSM, BidirectionalSSM)


def ssm_sublayers(model: nn.Module) -> list[nn.Module]:
    """The SSM sub-layers of ``model`` that ``ssm_outputs_zeroed`` zeroes."""
    return [module for module in model.modules() if isinstance(module, ABLATED_SSM_TYPES)]


def zero_ssm_outputs(model: nn.Module) -> tuple[int, Callable[[], None]]:
    """Make every SSM sub-layer of ``model`` output zeros of its output's shape, in ``forward`` and in ``step``
    (``CausalSSM``: ``B x n x D``, its input's shape). Returns their number and the function that undoes it.

    Raises ``ValueError`` for a model without any (an ablation of nothing would look like a free lunch).
    """
    layers = ssm_sublayers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no SSM sub-layer to zero "
                         f"(looked for {', '.join(t.__name__ for t in ABLATED_SSM_TYPES)})")
    handles = [layer.register_forward_hook(lambda _module, _inputs, output: torch.zeros_like(output))
               for layer in layers]
    stepping = [layer for layer in layers if isinstance(layer, CausalSSM)]
    for layer in stepping:  # an instance attribute shadows the class's step
        layer.step = lambda x, cache: torch.zeros_like(x)

    def undo() -> None:
        for handle in handles:
            handle.remove()
        for layer in stepping:
            del layer.step

    return len(layers), undo


@contextmanager
def ssm_outputs_zeroed(model: nn.Module) -> Iterator[int]:
    """Within the block, every SSM sub-layer of ``model`` outputs zeros (``zero_ssm_outputs``); yields their
    number."""
    count, undo = zero_ssm_outputs(model)
    try:
        yield count
    finally:
        undo()
