"""Greedy and beam search of one utterance over an ``OnnxTransducer``, in numpy: the project's searches
(``ssm_fairseq.asr.search.greedy_search`` and ``beam_search``, without LM fusion) for a runtime without torch.

They are ports, step for step, of those searches for one utterance, so that they choose as they choose: the
joiner's float32 log-softmax with the blank penalty, the suppressed units masked to -inf for the choice and scored
unmasked, the float64 running scores, the per-frame label limit (a hypothesis at the limit moves to the next frame
without a blank), prefixes leaving a frame with equal labels merged by adding probabilities (the best alignment's
token scores and frames kept), the ``beam`` best expansions of a round that beat the ``beam``-th prefix already out
of the frame, and the final ranking ``score / (labels + 1) ** length_norm``. Ties: the argmax takes the lowest unit
(as ``torch.argmax``); among equal expansion scores (exactly equal float64 sums) the lowest flat index comes first,
where ``torch.topk`` leaves the order unspecified. ``tests/test_onnx_runtime.py`` compares their transcripts with
the PyTorch searches'. Both keep their hypotheses between calls of ``advance``, so frames may come in chunks.
Imports numpy only (and the model it is given).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from ..asr.options import MAX_SYMBOLS_PER_FRAME
from ..asr.search.prefixes import Prefix, kth_best, leave_frame


class Hypothesis(NamedTuple):
    """One label sequence: its natural-log ``score``, and each label's emission log-probability and encoder frame on
    its best alignment (``asr.search.hypothesis.Hypothesis``'s fields)."""

    tokens: list[int]
    score: float
    token_scores: list[float]
    frames: list[int]


def check_search_arguments(max_symbols_per_frame: int, suppress: Sequence[int], blank: int) -> None:
    if max_symbols_per_frame < 1:
        raise ValueError(f"max_symbols_per_frame must be >= 1, got {max_symbols_per_frame}")
    if blank in suppress:
        raise ValueError(f"the blank ({blank}) cannot be suppressed")


def selectable(log_probs: np.ndarray, suppress: Sequence[int]) -> np.ndarray:
    """``N x V`` log-probabilities with the ``suppress`` units at -inf: what a search may choose from."""
    if not suppress:
        return log_probs
    masked = log_probs.copy()
    masked[:, list(suppress)] = -np.inf
    return masked


def ranking_score(score: float, length: int, length_norm: float) -> float:
    return score / (length + 1) ** length_norm


class GreedySearch:
    """At each frame the argmax unit; a label advances the predictor and the same frame is scored again, the blank
    (or ``max_symbols_per_frame`` labels) moves to the next frame."""

    def __init__(self, model, max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME, suppress: Sequence[int] = (),
                 blank_penalty: float = 0.0):
        check_search_arguments(max_symbols_per_frame, suppress, model.blank)
        self.model, self.max_symbols_per_frame = model, max_symbols_per_frame
        self.suppress, self.blank_penalty = list(suppress), blank_penalty
        self.predictor_proj, self.h, self.c = model.start_predictor(1)
        self.tokens: list[int] = []
        self.token_scores: list[float] = []
        self.frames: list[int] = []
        self.score = 0.0
        self.frames_done = 0

    def advance(self, encoder_proj: np.ndarray) -> None:
        """The next ``n x J`` projected encoder frames."""
        model = self.model
        for t in range(encoder_proj.shape[0]):
            for _ in range(self.max_symbols_per_frame):
                log_probs = model.joint_log_probs(encoder_proj[t:t + 1], self.predictor_proj, self.blank_penalty)
                best = int(selectable(log_probs, self.suppress)[0].argmax())
                best_score = float(log_probs[0, best])
                self.score += best_score
                if best == model.blank:
                    break
                self.tokens.append(best)
                self.token_scores.append(best_score)
                self.frames.append(self.frames_done + t)
                self.predictor_proj, self.h, self.c = model.predictor_step(np.array([best]), self.h, self.c)
        self.frames_done += encoder_proj.shape[0]

    def partial(self, length_norm: float = 0.0) -> Hypothesis:
        return Hypothesis(list(self.tokens), self.score, list(self.token_scores), list(self.frames))

    def finish(self, nbest: int = 1, length_norm: float = 0.0) -> list[Hypothesis]:
        if nbest != 1:
            raise ValueError(f"greedy search has one hypothesis, asked for nbest={nbest}")
        return [self.partial()]


class BeamSearch:
    """Frame-synchronous transducer beam search (``asr.search.beam_search.BeamSearch`` for one utterance)."""

    def __init__(self, model, beam: int, max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME,
                 suppress: Sequence[int] = (), blank_penalty: float = 0.0):
        check_search_arguments(max_symbols_per_frame, suppress, model.blank)
        if beam < 1:
            raise ValueError(f"need beam >= 1, got beam={beam}")
        self.model, self.beam, self.max_symbols_per_frame = model, beam, max_symbols_per_frame
        self.suppress, self.blank_penalty = list(suppress), blank_penalty
        self.bank_proj, self.bank_h, self.bank_c = model.start_predictor(1)  # one row per prefix in play
        self.beams = [Prefix((), 0.0, 0.0, (), (), 0)]
        self.frames_done = 0

    def advance(self, encoder_proj: np.ndarray) -> None:
        """The next ``n x J`` projected encoder frames."""
        model = self.model
        for t in range(encoder_proj.shape[0]):
            finished: dict[tuple[int, ...], Prefix] = {}
            frontier = list(self.beams)
            for _ in range(self.max_symbols_per_frame):
                rows = [prefix.row for prefix in frontier]
                log_probs = model.joint_log_probs(np.repeat(encoder_proj[t:t + 1], len(frontier), axis=0),
                                                  self.bank_proj[rows], self.blank_penalty)
                for prefix, blank_score in zip(frontier, log_probs[:, model.blank].tolist()):
                    leave_frame(finished, prefix, blank_score)
                frontier = self._expand(self.frames_done + t, frontier, log_probs, finished)
                if not frontier:
                    break
            for prefix in frontier:  # at the limit: on to the next frame, no blank scored
                leave_frame(finished, prefix, 0.0)
            self.beams = sorted(finished.values(), key=lambda p: -p.score)[:self.beam]
            self._compact()
        self.frames_done += encoder_proj.shape[0]

    def _expand(self, frame: int, frontier: list[Prefix], log_probs: np.ndarray,
                finished: dict[tuple[int, ...], Prefix]) -> list[Prefix]:
        """The ``beam`` best (prefix, label) pairs that beat the ``beam``-th prefix out of the frame, their predictor
        states computed in one step and appended to the bank."""
        vocab, blank = log_probs.shape[1], self.model.blank
        scores = np.array([p.score for p in frontier], dtype=np.float64)[:, None]
        scores = scores + selectable(log_probs, self.suppress).astype(np.float64)
        scores[:, blank] = -np.inf
        floor = kth_best(finished, self.beam)
        segment = scores.reshape(-1)
        top = np.argsort(-segment, kind="stable")[:min(self.beam, segment.size)]
        chosen = []
        for index in top.tolist():
            score = float(segment[index])
            if score <= floor:
                break
            chosen.append((index // vocab, index % vocab, score))
        if not chosen:
            return []
        parents = [frontier[i].row for i, _, _ in chosen]
        labels = np.array([label for _, label, _ in chosen], dtype=np.int64)
        label_scores = log_probs[[i for i, _, _ in chosen], labels].tolist()
        new_proj, new_h, new_c = self.model.predictor_step(labels, self.bank_h[:, parents], self.bank_c[:, parents])
        first = self.bank_proj.shape[0]
        self.bank_proj = np.concatenate([self.bank_proj, new_proj])
        self.bank_h = np.concatenate([self.bank_h, new_h], axis=1)
        self.bank_c = np.concatenate([self.bank_c, new_c], axis=1)
        return [Prefix(frontier[i].tokens + (label,), score, frontier[i].path_score + label_score,
                        frontier[i].token_scores + (label_score,), frontier[i].frames + (frame,), first + n)
                for n, ((i, label, score), label_score) in enumerate(zip(chosen, label_scores))]

    def _compact(self) -> None:
        """Keep only the bank rows the beams use, and renumber the prefixes."""
        used = sorted({prefix.row for prefix in self.beams})
        new_row = {row: n for n, row in enumerate(used)}
        self.beams = [p._replace(row=new_row[p.row]) for p in self.beams]
        self.bank_proj, self.bank_h, self.bank_c = self.bank_proj[used], self.bank_h[:, used], self.bank_c[:, used]

    def partial(self, length_norm: float = 0.0) -> Hypothesis:
        """The best hypothesis so far, ranked as ``finish`` ranks."""
        return _hypothesis(max(self.beams, key=lambda p: ranking_score(p.score, len(p.tokens), length_norm)))

    def finish(self, nbest: int = 1, length_norm: float = 0.0) -> list[Hypothesis]:
        """The ``nbest`` hypotheses (<= beam), best first by ``score / (labels + 1) ** length_norm``."""
        if not 1 <= nbest <= self.beam:
            raise ValueError(f"need 1 <= nbest <= beam; got beam={self.beam}, nbest={nbest}")
        ranked = sorted(self.beams, key=lambda p: -ranking_score(p.score, len(p.tokens), length_norm))
        return [_hypothesis(p) for p in ranked[:nbest]]


def _hypothesis(prefix: Prefix) -> Hypothesis:
    return Hypothesis(list(prefix.tokens), prefix.score, list(prefix.token_scores), list(prefix.frames))


def build_search(model, beam: int = 4, search: str = "exact", max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME,
                 suppress: Sequence[int] = (), blank_penalty: float = 0.0) -> GreedySearch | BeamSearch:
    """Greedy search for ``beam`` 1, else beam search; ``search="modified"``: one label per frame (the task's
    ``--search modified``)."""
    if search not in ("exact", "modified"):
        raise ValueError(f"search must be 'exact' or 'modified', got {search!r}")
    limit = 1 if search == "modified" else max_symbols_per_frame
    if beam == 1:
        return GreedySearch(model, limit, suppress, blank_penalty)
    return BeamSearch(model, beam, limit, suppress, blank_penalty)
