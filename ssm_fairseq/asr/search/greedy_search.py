"""Batched greedy transducer search: at each frame emit the argmax label until it is blank.

``GreedySearch`` keeps its hypotheses between calls, so the frames may come in chunks (streaming recognition):
any split of the encoder output gives the hypotheses of one call over all of it. ``greedy_search`` is one call.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .hypothesis import (
    MAX_SYMBOLS_PER_FRAME, ChunkedSearch, Hypothesis, SearchSettings, advance_predictor, joint_log_probs, select_rows,
    selectable, start_predictor,
)
from .lm_fusion import LanguageModelFusion


class GreedySearch(ChunkedSearch):
    """Greedy search over a batch of ``batch`` utterances whose encoder frames arrive in chunks.

    At frame ``t`` each utterance takes the joiner's argmax; a label is emitted (the predictor advances and the
    same frame is scored again), blank moves to frame ``t + 1``. An utterance that has emitted
    ``settings.max_symbols_per_frame`` labels in one frame moves on without a blank. Each round of a frame runs the
    joiner once, the predictor once and the language model (if fused) once for all the utterances still in it.

    Args:
        model: a ``TransducerModel`` (uses ``predictor``, ``joiner`` and ``blank``).
        batch: number of utterances.
        device: where the predictor and joiner run.
        settings: the rules of a frame (``SearchSettings``: labels per frame, suppressed units, blank penalty).
        fusion: a language model's weighted scores (``LanguageModelFusion``), added to every label's before the
            argmax (shallow fusion); the score is then the fused score, the LM's ``</s>`` score included.
    """

    @torch.no_grad()
    def __init__(self, model, batch: int, device: torch.device, settings: SearchSettings = SearchSettings(),
                 fusion: LanguageModelFusion | None = None):
        settings.check(model.blank)
        super().__init__(batch)
        self.model, self.settings, self.fusion = model, settings, fusion
        self.predictor_proj, self.state = start_predictor(model, batch, device)
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.token_scores: list[list[float]] = [[] for _ in range(batch)]
        self.frames: list[list[int]] = [[] for _ in range(batch)]
        self.scores = torch.zeros(batch, dtype=torch.float64, device=device)
        self.lm_rows = fusion.start(batch) if fusion is not None else None

    @torch.no_grad()
    def advance(self, encoder_out: Tensor, encoder_lengths: Tensor | None = None) -> None:
        """Search the next frames: ``encoder_out`` ``B x n x D``; ``encoder_lengths`` ``B``: how many of them each
        utterance has (default all ``n``). Frame numbers in the hypotheses count each utterance's frames from the
        first call."""
        lengths = self._chunk_lengths(encoder_out, encoder_lengths)
        encoder_lengths = torch.tensor(lengths, device=encoder_out.device)
        encoder_proj = self.model.joiner.encoder_proj(encoder_out)
        for t in range(encoder_out.shape[1]):
            rows = (encoder_lengths > t).nonzero().squeeze(1)  # utterances still in frame t
            for _ in range(self.settings.max_symbols_per_frame):
                if rows.numel() == 0:
                    break
                rows = self._round(encoder_proj[rows, t], rows, t)
            if self.fusion is not None:  # only the utterances' current LM states stay
                renumber = self.fusion.keep(self.lm_rows)
                self.lm_rows = [renumber[row] for row in self.lm_rows]
        self._chunk_done(lengths)

    def _round(self, encoder_rows: Tensor, rows: Tensor, t: int) -> Tensor:
        """One emission round of frame ``t`` for the utterances ``rows`` (their ``N x J`` encoder projections
        ``encoder_rows``): score, take the argmax, record the labels -> the utterances that emitted one."""
        model, settings = self.model, self.settings
        log_probs = joint_log_probs(model, encoder_rows, self.predictor_proj[rows], settings.blank_penalty)
        if self.fusion is not None:
            log_probs = log_probs + self.fusion.scores([self.lm_rows[row] for row in rows.tolist()], log_probs.device)
        best = selectable(log_probs, settings.suppress).argmax(-1)
        best_score = log_probs.gather(1, best.unsqueeze(1)).squeeze(1)
        self.scores.index_add_(0, rows, best_score.double())
        emit = best != model.blank
        rows, labels, label_scores = rows[emit], best[emit], best_score[emit]
        for row, label, score in zip(rows.tolist(), labels.tolist(), label_scores.tolist()):
            self.tokens[row].append(label)
            self.token_scores[row].append(score)
            self.frames[row].append(self.frames_done[row] + t)
        if rows.numel():
            self._emit(rows, labels)
        return rows

    def _emit(self, rows: Tensor, labels: Tensor) -> None:
        """Advance the predictor (and the LM) of ``rows`` by their emitted ``labels``."""
        if self.fusion is not None:
            emitting = rows.tolist()
            advanced = self.fusion.advance([self.lm_rows[row] for row in emitting], labels.tolist())
            for row, lm_row in zip(emitting, advanced):
                self.lm_rows[row] = lm_row
        new_proj, new_state = advance_predictor(self.model, labels, select_rows(self.state, rows))
        self.predictor_proj = self.predictor_proj.index_copy(0, rows, new_proj)
        self.state = [(h.index_copy(1, rows, nh), c.index_copy(1, rows, nc))
                      for (h, c), (nh, nc) in zip(self.state, new_state)]

    def partial(self, length_norm: float = 0.0) -> list[Hypothesis]:
        """The hypotheses so far, one per utterance (without the LM's ``</s>`` score); ``length_norm`` does not
        matter (one hypothesis): the argument of ``BeamSearch.partial``."""
        return [Hypothesis(list(self.tokens[b]), self.scores[b].item(), list(self.token_scores[b]),
                           list(self.frames[b])) for b in range(len(self.tokens))]

    @torch.no_grad()
    def finish(self, nbest: int = 1, length_norm: float = 0.0) -> list[list[Hypothesis]]:
        """The utterances end here: for each, a list of its one hypothesis (the LM's ``</s>`` score is added).
        ``nbest`` must be 1 and ``length_norm`` does not matter (one hypothesis): the arguments of
        ``BeamSearch.finish``."""
        if nbest != 1:
            raise ValueError(f"greedy search has one hypothesis per utterance, asked for nbest={nbest}")
        self._finishing()
        if self.fusion is not None:
            self.scores += torch.tensor(self.fusion.eos_scores(self.lm_rows), dtype=torch.float64,
                                        device=self.scores.device)
        return [[hypothesis] for hypothesis in self.partial()]


def greedy_search(
    model, encoder_out: Tensor, encoder_lengths: Tensor, max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME,
    suppress: Sequence[int] = (), blank_penalty: float = 0.0, fusion: LanguageModelFusion | None = None,
) -> list[Hypothesis]:
    """Greedy search (``GreedySearch``; the arguments of its ``SearchSettings`` are given here one by one) over a
    whole batch: ``encoder_out`` ``B x T x D`` and ``encoder_lengths`` ``B`` valid frames per utterance. Returns one
    ``Hypothesis`` per utterance."""
    settings = SearchSettings(max_symbols_per_frame, tuple(suppress), blank_penalty)
    search = GreedySearch(model, encoder_out.shape[0], encoder_out.device, settings, fusion)
    search.advance(encoder_out, encoder_lengths)
    return [hypotheses[0] for hypotheses in search.finish()]
