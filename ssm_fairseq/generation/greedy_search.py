"""Batched greedy transducer search: at each frame emit the argmax label until it is blank."""
from __future__ import annotations

import torch
from torch import Tensor

from .hypothesis import Hypothesis, advance_predictor, select_rows, start_predictor


@torch.no_grad()
def greedy_search(model, encoder_out: Tensor, encoder_lengths: Tensor, max_symbols_per_frame: int = 3) -> list[Hypothesis]:
    """Greedy search over a batch.

    At frame ``t`` each utterance takes the joiner's argmax; a label is emitted (the predictor advances and the
    same frame is scored again), blank moves to frame ``t + 1``. After ``max_symbols_per_frame`` labels in one
    frame, the frame is left as if blank had won (its blank log-probability is scored).

    Args:
        model: a ``TransducerModel`` (uses ``predictor``, ``joiner`` and ``blank``).
        encoder_out: ``B x T x D`` encoder output.
        encoder_lengths: ``B`` valid frames per utterance.
        max_symbols_per_frame: labels allowed per frame (>= 1).

    Returns:
        one ``Hypothesis`` per utterance.
    """
    if max_symbols_per_frame < 1:
        raise ValueError(f"max_symbols_per_frame must be >= 1, got {max_symbols_per_frame}")
    batch, device = encoder_out.shape[0], encoder_out.device
    encoder_proj = model.joiner.encoder_proj(encoder_out)
    predictor_proj, state = start_predictor(model, batch, device)
    tokens: list[list[int]] = [[] for _ in range(batch)]
    token_scores: list[list[float]] = [[] for _ in range(batch)]
    scores = torch.zeros(batch, dtype=torch.float64, device=device)
    for t in range(encoder_out.shape[1]):
        rows = (encoder_lengths > t).nonzero().squeeze(1)  # utterances still scoring frame t
        for emitted in range(max_symbols_per_frame + 1):
            if rows.numel() == 0:
                break
            log_probs = model.joiner.step(encoder_proj[rows, t], predictor_proj[rows]).log_softmax(-1)
            best_score, best = log_probs.max(-1)
            emit = best != model.blank
            if emitted == max_symbols_per_frame:
                emit.zero_()
            blank_score = log_probs[:, model.blank]
            scores.index_add_(0, rows, torch.where(emit, best_score, blank_score).double())
            rows, labels, label_scores = rows[emit], best[emit], best_score[emit]
            for row, label, score in zip(rows.tolist(), labels.tolist(), label_scores.tolist()):
                tokens[row].append(label)
                token_scores[row].append(score)
            if rows.numel():
                new_proj, new_state = advance_predictor(model, labels, select_rows(state, rows))
                predictor_proj = predictor_proj.index_copy(0, rows, new_proj)
                state = [(h.index_copy(1, rows, nh), c.index_copy(1, rows, nc))
                         for (h, c), (nh, nc) in zip(state, new_state)]
    return [Hypothesis(tokens[b], scores[b].item(), token_scores[b]) for b in range(batch)]
