"""Batched transducer beam search over the exact RNN-T lattice, with a label limit per frame.

Every frame ends with a blank, as in the lattice the RNN-T loss sums over; within a frame a prefix may emit
up to ``max_symbols_per_frame`` labels first. Prefixes that leave a frame with the same labels are merged by
adding their probabilities (they reach the same lattice node, whose future depends only on the labels), so
with a beam wide enough to keep every prefix the search returns the most probable label sequence under
the per-frame limit, with its exact probability. This is the frame-synchronous search of Graves (2012)
restricted like icefall's "modified beam search" to a fixed number of labels per frame, batched over
utterances: each expansion round runs the joiner once and the predictor once for all utterances.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .hypothesis import Hypothesis, advance_predictor, select_rows, start_predictor


class _Prefix(NamedTuple):
    tokens: tuple[int, ...]
    score: float  # log-probability of the alignments merged into this prefix
    token_scores: tuple[float, ...]
    row: int  # the predictor state of this prefix in the search's state bank


def _log_add(a: float, b: float) -> float:
    high, low = max(a, b), min(a, b)
    return high + math.log1p(math.exp(low - high)) if low > -math.inf else high


def _leave_frame(finished: dict[tuple[int, ...], _Prefix], prefix: _Prefix, score: float) -> None:
    """Record ``prefix`` leaving the frame by blank with log-probability ``score``, merging equal labels."""
    known = finished.get(prefix.tokens)
    finished[prefix.tokens] = prefix._replace(score=score) if known is None else known._replace(
        score=_log_add(known.score, score))


def _kth_best(finished: dict[tuple[int, ...], _Prefix], k: int) -> float:
    """Score of the k-th best prefix that has left the frame; -inf while there are fewer than k."""
    if len(finished) < k:
        return -math.inf
    return sorted((p.score for p in finished.values()), reverse=True)[k - 1]


@torch.no_grad()
def beam_search(
    model, encoder_out: Tensor, encoder_lengths: Tensor, beam: int, max_symbols_per_frame: int = 3, nbest: int = 1
) -> list[list[Hypothesis]]:
    """Beam search over a batch.

    Args:
        model: a ``TransducerModel`` (uses ``predictor``, ``joiner`` and ``blank``).
        encoder_out: ``B x T x D`` encoder output.
        encoder_lengths: ``B`` valid frames per utterance.
        beam: prefixes kept per utterance after each frame, and label expansions kept per round.
        max_symbols_per_frame: labels a prefix may emit within one frame (>= 1).
        nbest: hypotheses returned per utterance (<= beam), best first.

    Returns:
        for each utterance, its ``nbest`` hypotheses sorted by score.
    """
    if beam < 1 or max_symbols_per_frame < 1 or not 1 <= nbest <= beam:
        raise ValueError(f"need beam >= 1, max_symbols_per_frame >= 1 and 1 <= nbest <= beam; "
                         f"got beam={beam}, max_symbols_per_frame={max_symbols_per_frame}, nbest={nbest}")
    batch, device, blank = encoder_out.shape[0], encoder_out.device, model.blank
    encoder_proj = model.joiner.encoder_proj(encoder_out)
    # The state bank: predictor projection and LSTM state of every prefix in play, one row each.
    bank_proj, bank_state = start_predictor(model, 1, device)
    beams = [[_Prefix((), 0.0, (), 0)] for _ in range(batch)]
    lengths = encoder_lengths.tolist()
    for t in range(max(lengths, default=0)):
        live = [b for b in range(batch) if lengths[b] > t]
        finished: dict[int, dict[tuple[int, ...], _Prefix]] = {b: {} for b in live}
        frontier = [(b, prefix) for b in live for prefix in beams[b]]  # grouped by utterance
        for emitted in range(max_symbols_per_frame + 1):
            utterances = torch.tensor([b for b, _ in frontier], device=device)
            rows = torch.tensor([prefix.row for _, prefix in frontier], device=device)
            log_probs = model.joiner.step(encoder_proj[utterances, t], bank_proj[rows]).log_softmax(-1)
            for (b, prefix), blank_score in zip(frontier, log_probs[:, blank].tolist()):
                _leave_frame(finished[b], prefix, prefix.score + blank_score)
            if emitted == max_symbols_per_frame:
                break
            frontier, bank_proj, bank_state = _expand(
                model, frontier, log_probs, finished, beam, bank_proj, bank_state)
            if not frontier:
                break
        for b in live:
            beams[b] = sorted(finished[b].values(), key=lambda p: -p.score)[:beam]
        bank_proj, bank_state, beams = _compact(bank_proj, bank_state, beams)
    return [[Hypothesis(list(p.tokens), p.score, list(p.token_scores)) for p in prefixes[:nbest]]
            for prefixes in beams]


def _expand(model, frontier, log_probs, finished, beam, bank_proj, bank_state):
    """Extend the frontier by one label: the ``beam`` best (prefix, label) pairs of each utterance.

    Pairs that score below the beam-th best prefix already out of the frame are dropped: labels only lower
    a score. The new prefixes' predictor states are computed in one batched step and appended to the bank.
    """
    vocab = log_probs.shape[1]
    scores = torch.tensor([prefix.score for _, prefix in frontier], dtype=torch.float64, device=log_probs.device)
    scores = scores.unsqueeze(1) + log_probs.double()
    scores[:, model.blank] = -math.inf
    chosen: list[tuple[int, int, float]] = []  # (frontier index, label, score)
    start = 0
    while start < len(frontier):
        b = frontier[start][0]
        end = start
        while end < len(frontier) and frontier[end][0] == b:
            end += 1
        floor = _kth_best(finished[b], beam)
        segment = scores[start:end].flatten()
        top_scores, top_index = segment.topk(min(beam, segment.numel()))
        for score, index in zip(top_scores.tolist(), top_index.tolist()):
            if score <= floor:
                break
            chosen.append((start + index // vocab, index % vocab, score))
        start = end
    if not chosen:
        return [], bank_proj, bank_state
    parents = torch.tensor([frontier[i][1].row for i, _, _ in chosen], device=log_probs.device)
    labels = torch.tensor([label for _, label, _ in chosen], device=log_probs.device)
    label_scores = log_probs[torch.tensor([i for i, _, _ in chosen]), labels].tolist()
    new_proj, new_state = advance_predictor(model, labels, select_rows(bank_state, parents))
    first = bank_proj.shape[0]
    bank_proj = torch.cat([bank_proj, new_proj])
    bank_state = [(torch.cat([h, nh], 1), torch.cat([c, nc], 1)) for (h, c), (nh, nc) in zip(bank_state, new_state)]
    new_frontier = []
    for n, ((i, label, score), label_score) in enumerate(zip(chosen, label_scores)):
        b, parent = frontier[i]
        new_frontier.append(
            (b, _Prefix(parent.tokens + (label,), score, parent.token_scores + (label_score,), first + n)))
    return new_frontier, bank_proj, bank_state


def _compact(bank_proj, bank_state, beams):
    """Keep only the bank rows that the beams use, and renumber the prefixes."""
    used = sorted({prefix.row for prefixes in beams for prefix in prefixes})
    new_row = {row: n for n, row in enumerate(used)}
    index = torch.tensor(used, device=bank_proj.device)
    beams = [[p._replace(row=new_row[p.row]) for p in prefixes] for prefixes in beams]
    return bank_proj[index], select_rows(bank_state, index), beams
