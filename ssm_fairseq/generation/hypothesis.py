"""A transducer search result and the predictor steps that both searches share."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..modules.predictor import State


@dataclass
class Hypothesis:
    """One label sequence for one utterance.

    ``score`` is the natural-log probability of the alignments the search kept (blanks included);
    ``token_scores[i]`` is the log-probability with which ``tokens[i]`` was emitted.
    """

    tokens: list[int]
    score: float
    token_scores: list[float]


def start_predictor(model, batch_size: int, device: torch.device) -> tuple[Tensor, State]:
    """The predictor after the start symbol (blank) for ``batch_size`` rows: ``N x J`` projection and state."""
    blank = torch.full((batch_size,), model.blank, dtype=torch.long, device=device)
    return advance_predictor(model, blank, None)


def advance_predictor(model, labels: Tensor, state: State | None) -> tuple[Tensor, State]:
    """Feed one label per row (``N``) -> the joiner's projection of the predictor output ``N x J``, new state."""
    out, state = model.predictor(labels.unsqueeze(1), state)
    return model.joiner.predictor_proj(out[:, 0]), state


def select_rows(state: State, rows: Tensor) -> State:
    """The predictor state of ``rows`` (``N`` indices) of a batched state."""
    return [(h[:, rows], c[:, rows]) for h, c in state]
