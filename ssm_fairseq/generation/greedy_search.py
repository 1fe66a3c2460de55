"""Batched greedy transducer search: at each frame emit the argmax label until it is blank."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .hypothesis import (
    MAX_SYMBOLS_PER_FRAME, Hypothesis, advance_predictor, check_search_arguments, joint_log_probs, select_rows,
    selectable, start_predictor,
)
from .lm_fusion import LanguageModelFusion


@torch.no_grad()
def greedy_search(
    model, encoder_out: Tensor, encoder_lengths: Tensor, max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME,
    suppress: Sequence[int] = (), blank_penalty: float = 0.0, fusion: LanguageModelFusion | None = None,
) -> list[Hypothesis]:
    """Greedy search over a batch.

    At frame ``t`` each utterance takes the joiner's argmax; a label is emitted (the predictor advances and the
    same frame is scored again), blank moves to frame ``t + 1``. An utterance that has emitted
    ``max_symbols_per_frame`` labels in one frame moves to frame ``t + 1`` without a blank: the limit bounds the
    work, it never scores a blank the model did not choose. The score is the log-probability of the path taken,
    which is that of an RNN-T alignment whenever the limit did not bind.

    Args:
        model: a ``TransducerModel`` (uses ``predictor``, ``joiner`` and ``blank``).
        encoder_out: ``B x T x D`` encoder output.
        encoder_lengths: ``B`` valid frames per utterance.
        max_symbols_per_frame: labels allowed per frame (>= 1).
        suppress: units never emitted (e.g. ``<pad>``, ``<unk>``, ``</s>``); the blank cannot be suppressed.
        blank_penalty: subtracted from the blank's logit (``joint_log_probs``); 0 keeps the model's scores.
        fusion: a language model's weighted scores (``LanguageModelFusion``), added to every label's before the
            argmax (shallow fusion); the score is then the fused score, the LM's ``</s>`` score included.

    Returns:
        one ``Hypothesis`` per utterance.
    """
    check_search_arguments(max_symbols_per_frame, suppress, model.blank)
    batch, device = encoder_out.shape[0], encoder_out.device
    encoder_proj = model.joiner.encoder_proj(encoder_out)
    predictor_proj, state = start_predictor(model, batch, device)
    tokens: list[list[int]] = [[] for _ in range(batch)]
    token_scores: list[list[float]] = [[] for _ in range(batch)]
    frames: list[list[int]] = [[] for _ in range(batch)]
    scores = torch.zeros(batch, dtype=torch.float64, device=device)
    lm_rows = fusion.start(batch) if fusion is not None else None
    for t in range(encoder_out.shape[1]):
        rows = (encoder_lengths > t).nonzero().squeeze(1)  # utterances still in frame t
        for _ in range(max_symbols_per_frame):
            if rows.numel() == 0:
                break
            log_probs = joint_log_probs(model, encoder_proj[rows, t], predictor_proj[rows], blank_penalty)
            if fusion is not None:
                log_probs = log_probs + fusion.scores([lm_rows[row] for row in rows.tolist()], device)
            best = selectable(log_probs, suppress).argmax(-1)
            best_score = log_probs.gather(1, best.unsqueeze(1)).squeeze(1)
            scores.index_add_(0, rows, best_score.double())
            emit = best != model.blank
            rows, labels, label_scores = rows[emit], best[emit], best_score[emit]
            for row, label, score in zip(rows.tolist(), labels.tolist(), label_scores.tolist()):
                tokens[row].append(label)
                token_scores[row].append(score)
                frames[row].append(t)
            if rows.numel():
                if fusion is not None:
                    emitting = rows.tolist()
                    advanced = fusion.advance([lm_rows[row] for row in emitting], labels.tolist())
                    for row, lm_row in zip(emitting, advanced):
                        lm_rows[row] = lm_row
                new_proj, new_state = advance_predictor(model, labels, select_rows(state, rows))
                predictor_proj = predictor_proj.index_copy(0, rows, new_proj)
                state = [(h.index_copy(1, rows, nh), c.index_copy(1, rows, nc))
                         for (h, c), (nh, nc) in zip(state, new_state)]
        if fusion is not None:  # only the utterances' current LM states stay
            renumber = fusion.keep(lm_rows)
            lm_rows = [renumber[row] for row in lm_rows]
    if fusion is not None:
        scores += torch.tensor(fusion.eos_scores(lm_rows), dtype=torch.float64, device=device)
    return [Hypothesis(tokens[b], scores[b].item(), token_scores[b], frames[b]) for b in range(batch)]
