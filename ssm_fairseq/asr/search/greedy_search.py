"""Batched greedy transducer search: at each frame emit the argmax label until it is blank.

``GreedySearch`` keeps its hypotheses between calls, so the frames may come in chunks (streaming recognition):
any split of the encoder output gives the hypotheses of one call over all of it. ``greedy_search`` is one call.

The utterances of a batch do not move frame by frame together: each round, every utterance scores its next
``frames_per_round`` frames with its current predictor (and LM) state and goes to the first of them whose argmax is
a label, taking the blanks before it. Its predictor and LM step only when it emits, so a round steps them once for
every utterance that emitted in it, and a batch needs about as many rounds as its longest transcript has labels
(where moving frame by frame together it needs about one per frame with any emission, each with a few rows): the
choices, frames and scores are those of the frame-by-frame search.
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


FRAMES_PER_ROUND = 8  # frames an utterance scores ahead in one round; about 2-3 per label in speech


class GreedySearch(ChunkedSearch):
    """Greedy search over a batch of ``batch`` utterances whose encoder frames arrive in chunks.

    At frame ``t`` an utterance takes the joiner's argmax; a label is emitted (the predictor advances and the same
    frame is scored again), blank moves to frame ``t + 1``. An utterance that has emitted
    ``settings.max_symbols_per_frame`` labels in one frame moves on without a blank. Each round scores, for every
    utterance with frames left, its next ``frames_per_round`` frames at once (the joiner once for all), then runs
    the predictor and the language model (if fused) once for all the utterances that emitted (module docstring).

    Args:
        model: a ``TransducerModel`` (uses ``predictor``, ``joiner`` and ``blank``).
        batch: number of utterances.
        device: where the predictor and joiner run.
        settings: the rules of a frame (``SearchSettings``: labels per frame, suppressed units, blank penalty).
        fusion: a language model's weighted scores (``LanguageModelFusion``), added to every label's before the
            argmax (shallow fusion); the score is then the fused score, the LM's ``</s>`` score included.
        frames_per_round: frames an utterance scores ahead per round (>= 1). Any value gives the same hypotheses;
            a larger one takes fewer rounds over long runs of blanks and scores more frames that an emission makes
            stale.
    """

    @torch.no_grad()
    def __init__(self, model, batch: int, device: torch.device, settings: SearchSettings = SearchSettings(),
                 fusion: LanguageModelFusion | None = None, frames_per_round: int = FRAMES_PER_ROUND):
        settings.check(model.blank)
        if frames_per_round < 1:
            raise ValueError(f"frames_per_round must be >= 1, got {frames_per_round}")
        super().__init__(batch)
        self.model, self.settings, self.fusion = model, settings, fusion
        self.frames_per_round = frames_per_round
        self.predictor_proj, self.state = start_predictor(model, batch, device)
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.token_scores: list[list[float]] = [[] for _ in range(batch)]
        self.frames: list[list[int]] = [[] for _ in range(batch)]
        self.scores = torch.zeros(batch, dtype=torch.float64, device=device)
        self.lm_rows = fusion.start(batch) if fusion is not None else None
        self.rounds = 0  # rounds run so far (each one predictor step at most)

    @torch.no_grad()
    def advance(self, encoder_out: Tensor, encoder_lengths: Tensor | None = None) -> None:
        """Search the next frames: ``encoder_out`` ``B x n x D``; ``encoder_lengths`` ``B``: how many of them each
        utterance has (default all ``n``). Frame numbers in the hypotheses count each utterance's frames from the
        first call."""
        lengths = self._chunk_lengths(encoder_out, encoder_lengths)
        device = encoder_out.device
        encoder_proj = self.model.joiner.encoder_proj(encoder_out)
        length = torch.tensor(lengths, device=device)
        at = torch.zeros(len(lengths), dtype=torch.long, device=device)  # each utterance's frame in the chunk
        emitted = torch.zeros_like(at)  # labels it has emitted in that frame
        ahead = torch.arange(self.frames_per_round, device=device)
        while True:
            rows = (at < length).nonzero().squeeze(1)  # utterances with frames left
            if rows.numel() == 0:
                break
            frames = at[rows, None] + ahead  # N x W
            in_chunk = frames < length[rows, None]
            encoder_rows = encoder_proj[rows[:, None], frames.clamp(max=encoder_out.shape[1] - 1)]  # N x W x J
            at[rows], emitted[rows], emitting, labels = self._round(encoder_rows, in_chunk, rows, at[rows],
                                                                     emitted[rows])
            if emitting.numel():
                self._emit(emitting, labels)
            if self.fusion is not None:  # only the utterances' current LM states stay
                renumber = self.fusion.keep(self.lm_rows)
                self.lm_rows = [renumber[row] for row in self.lm_rows]
        self._chunk_done(lengths)

    def _round(self, encoder_rows: Tensor, in_chunk: Tensor, rows: Tensor, at: Tensor,
               emitted: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One round for the utterances ``rows`` (``N``), each at frame ``at`` of the chunk having emitted
        ``emitted`` labels there: their next ``W`` frames' encoder projections ``encoder_rows`` (``N x W x J``;
        ``in_chunk``, ``N x W``: which of them are frames of the utterance) scored with the current predictor (and
        LM) state; blanks are taken up to the first frame whose argmax is a label, which is emitted there ->
        each utterance's new frame and label count, the utterances that emitted and their labels."""
        model, settings = self.model, self.settings
        self.rounds += 1
        N, W, J = encoder_rows.shape
        predictor_rows = self.predictor_proj[rows, None].expand(N, W, J)
        log_probs = joint_log_probs(model, encoder_rows.flatten(0, 1), predictor_rows.flatten(0, 1),
                                    settings.blank_penalty).view(N, W, -1)
        if self.fusion is not None:  # N x V, the same at every frame: the LM has seen the same labels
            lm_scores = self.fusion.scores([self.lm_rows[row] for row in rows.tolist()], log_probs.device)
            log_probs = log_probs + lm_scores[:, None]
        best = selectable(log_probs, settings.suppress).argmax(-1)  # N x W
        is_label = (best != model.blank) & in_chunk
        emits = is_label.any(1)
        # the frame of the first label (or past the last frame scored), and the blank scores before it
        first = torch.where(emits, is_label.int().argmax(1), in_chunk.sum(1))
        taken = torch.arange(best.shape[1], device=best.device) < first[:, None]
        self.scores.index_add_(0, rows, log_probs[..., model.blank].double().masked_fill(~taken, 0.0).sum(1))
        emitted = torch.where(first > 0, 0, emitted)  # a blank moved it to a new frame
        at = at + first
        rows, first, at_emit = rows[emits], first[emits], at[emits]
        labels = best[emits, first]
        label_scores = log_probs[emits, first, labels]
        self.scores.index_add_(0, rows, label_scores.double())
        for row, label, score, frame in zip(rows.tolist(), labels.tolist(), label_scores.tolist(), at_emit.tolist()):
            self.tokens[row].append(label)
            self.token_scores[row].append(score)
            self.frames[row].append(self.frames_done[row] + frame)
        emitted = emitted + emits.long()
        full = emitted == settings.max_symbols_per_frame  # on to the next frame without a blank
        return at + full.long(), torch.where(full, 0, emitted), rows, labels

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
    frames_per_round: int = FRAMES_PER_ROUND,
) -> list[Hypothesis]:
    """Greedy search (``GreedySearch``; the arguments of its ``SearchSettings`` are given here one by one) over a
    whole batch: ``encoder_out`` ``B x T x D`` and ``encoder_lengths`` ``B`` valid frames per utterance. Returns one
    ``Hypothesis`` per utterance."""
    settings = SearchSettings(max_symbols_per_frame, tuple(suppress), blank_penalty)
    search = GreedySearch(model, encoder_out.shape[0], encoder_out.device, settings, fusion, frames_per_round)
    search.advance(encoder_out, encoder_lengths)
    return [hypotheses[0] for hypotheses in search.finish()]
