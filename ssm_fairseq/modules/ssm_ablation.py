"""Ablation of a trained model's state space part: the same weights with every SSM sub-layer's output zeroed.

A global layer that can be removed at no cost has learned nothing the local layers lack; evaluating a checkpoint
inside ``ssm_outputs_zeroed(model)`` measures what its SSM contributes. Zeroed are the outputs of the causal SSM
sub-layers (``CausalSSM``: SPADE's decoder global layers) and of the bidirectional SSM blocks
(``BidirectionalSSM``: SPADE's encoder global layers; also the MSSM block of an MSSM encoder layer, where it is the
layer's only mixing of positions). In a SPADE global layer the merge then reads
``LN(0)``, the SSM LayerNorm's bias: a constant, so nothing of the input reaches the merge through the SSM path.
Only ``forward`` is affected (a decoder's step mode is not).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from .bidirectional_ssm import BidirectionalSSM
from .causal_ssm import CausalSSM

ABLATED_SSM_TYPES = (CausalSSM, BidirectionalSSM)


def ssm_sublayers(model: nn.Module) -> list[nn.Module]:
    """The SSM sub-layers of ``model`` that ``ssm_outputs_zeroed`` zeroes."""
    return [module for module in model.modules() if isinstance(module, ABLATED_SSM_TYPES)]


@contextmanager
def ssm_outputs_zeroed(model: nn.Module) -> Iterator[int]:
    """Within the block, every SSM sub-layer of ``model`` outputs zeros of its output's shape; yields their number.

    Raises ``ValueError`` for a model without any (an ablation of nothing would look like a free lunch).
    """
    layers = ssm_sublayers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no SSM sub-layer to zero "
                         f"(looked for {', '.join(t.__name__ for t in ABLATED_SSM_TYPES)})")
    handles = [layer.register_forward_hook(lambda _module, _inputs, output: torch.zeros_like(output))
               for layer in layers]
    try:
        yield len(layers)
    finally:
        for handle in handles:
            handle.remove()
