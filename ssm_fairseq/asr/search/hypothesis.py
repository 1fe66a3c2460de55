"""What greedy and beam search share: the result (``Hypothesis``), the rules of a frame (``SearchSettings``), the
resumable frame count (``ChunkedSearch``) and the joiner and predictor steps."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from ..options import MAX_SYMBOLS_PER_FRAME  # the per-frame label limit, defined (torch-free) with the options
from ..transducer.predictor import State


@dataclass
class Hypothesis:
    """One label sequence for one utterance.

    ``score`` is the natural-log probability of the hypothesis under the model: the log-sum of the
    probabilities of the alignments the search merged into it (greedy search keeps one), each alignment scored
    with every label and every blank it takes. ``token_scores[i]`` is the log-probability with which
    ``tokens[i]`` was emitted and ``frames[i]`` the encoder frame it was emitted at, on the most probable of
    those alignments.
    """

    tokens: list[int]
    score: float
    token_scores: list[float]
    frames: list[int]


class ChunkedSearch:
    """What the resumable searches share: each utterance's count of encoder frames searched (its next frame's
    number) and the end of the search (``finish`` once; no frames after it)."""

    def __init__(self, batch: int):
        self.frames_done = [0] * batch
        self.finished = False

    def _chunk_lengths(self, encoder_out: Tensor, encoder_lengths: Tensor | None) -> list[int]:
        """Each utterance's frames in the chunk ``encoder_out`` (``B x n x D``): ``encoder_lengths``, or all ``n``."""
        if self.finished:
            raise ValueError("the search has finished: start a new one for new utterances")
        if encoder_lengths is None:
            return [encoder_out.shape[1]] * encoder_out.shape[0]
        return encoder_lengths.tolist()

    def _chunk_done(self, lengths: list[int]) -> None:
        self.frames_done = [done + n for done, n in zip(self.frames_done, lengths)]

    def _finishing(self) -> None:
        if self.finished:
            raise ValueError("the search has finished already")
        self.finished = True


@dataclass(frozen=True)
class SearchSettings:
    """The rules of a frame, the same in greedy and beam search.

    Args:
        max_symbols_per_frame: labels a hypothesis may emit within one encoder frame before the search moves it to
            the next frame without a blank (>= 1; 1 is icefall's "modified beam search" topology).
        suppress: units never emitted (e.g. ``<pad>``, ``<unk>``, ``</s>``); the blank cannot be suppressed.
        blank_penalty: subtracted from the blank's logit (``joint_log_probs``); 0 keeps the model's scores.
    """

    max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME
    suppress: tuple[int, ...] = ()
    blank_penalty: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "suppress", tuple(self.suppress))
        if self.max_symbols_per_frame < 1:
            raise ValueError(f"max_symbols_per_frame must be >= 1, got {self.max_symbols_per_frame}")

    def check(self, blank: int) -> None:
        """Refuse a suppressed blank (the search could never leave a frame)."""
        if blank in self.suppress:
            raise ValueError(f"the blank ({blank}) cannot be suppressed")


def selectable(log_probs: Tensor, suppress: Sequence[int]) -> Tensor:
    """``... x V`` log-probabilities with the ``suppress`` units at -inf: what a search may choose from.

    Scores are always taken from the unmasked ``log_probs``, so a hypothesis's score stays the model's.
    """
    if not suppress:
        return log_probs
    masked = log_probs.clone()
    masked[..., list(suppress)] = -torch.inf
    return masked


def joint_log_probs(model, encoder_rows: Tensor, predictor_rows: Tensor, blank_penalty: float = 0.0) -> Tensor:
    """The joiner's ``N x V`` log-probabilities for ``N`` (encoder frame, predictor output) projection pairs.

    ``blank_penalty`` (icefall's) is subtracted from the blank's logit before the softmax: a positive value makes
    the search emit more labels (fewer deletions), and the scores are then those of the penalised distribution.
    The log-softmax runs in float32 whatever the model's dtype (a float16 or bfloat16 model after
    ``fairseq-generate --fp16`` / ``--bf16``), so scores keep float32 resolution; float64 models stay float64.
    """
    logits = model.joiner.step(encoder_rows, predictor_rows)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if blank_penalty:
        logits[:, model.blank] -= blank_penalty
    return logits.log_softmax(-1)


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
