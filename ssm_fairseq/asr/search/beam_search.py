"""Batched transducer beam search over the RNN-T lattice.

Frame-synchronous search (Graves, 2012), batched over utterances: within frame ``t`` a prefix either leaves by
blank or emits a label and is scored again at the same frame; each expansion round runs the joiner once and the
predictor once for all utterances. Prefixes that leave a frame with the same labels are merged by adding their
probabilities (they reach the same lattice node, whose future depends only on the labels), so with a beam wide
enough to keep every prefix the search returns the most probable label sequences with their exact
probabilities, ``log P(y | x)``. ``BeamSearch`` keeps its prefixes between calls, so the frames may come in
chunks (streaming recognition).

A prefix that has emitted ``max_symbols_per_frame`` labels in one frame moves to the next frame without a blank
(the limit bounds the work and never scores a blank the model did not choose; with a limit of 1 this is
icefall's "modified beam search" topology). The default limit is high enough never to bind on a trained model,
so by default every score is an RNN-T probability.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch
from torch import Tensor

from .hypothesis import (
    MAX_SYMBOLS_PER_FRAME, ChunkedSearch, Hypothesis, SearchSettings, joint_log_probs, selectable, start_predictor,
)
from .lm_fusion import LanguageModelFusion
from .predictor_bank import PredictorBank
from .prefix_tree import Chain, Labels
from .prefixes import Prefix, kth_best, leave_frame


class _Expansion(NamedTuple):
    """A label chosen to extend a prefix of the frontier: the prefix's index in it, the label, the new score."""

    index: int
    label: int
    score: float


def ranking_score(score: float, length: int, length_norm: float) -> float:
    """The final ranking key of a hypothesis of ``length`` labels: ``score / (length + 1) ** length_norm``.

    0 ranks by log-probability; 1 by log-probability per predictor step (the start symbol counts), the default
    of icefall and torchaudio and, as ``--lenpen 1``, of fairseq's sequence generator."""
    return score / (length + 1) ** length_norm


class BeamSearch(ChunkedSearch):
    """Beam search over a batch of ``batch`` utterances whose encoder frames arrive in chunks.

    The hypotheses are kept between calls, so any split of the encoder output gives the hypotheses of one call
    over all of it (streaming recognition); ``beam_search`` is one call. Each expansion round of a frame runs the
    joiner once, the predictor once and the language model (if fused) in as few calls as its states allow
    (``LanguageModelFusion``) for the prefixes of all utterances.

    Args:
        model: a ``TransducerModel`` (uses ``predictor``, ``joiner`` and ``blank``).
        batch: number of utterances.
        device: where the predictor and joiner run.
        beam: prefixes kept per utterance after each frame, and label expansions kept per round.
        settings: the rules of a frame (``SearchSettings``: labels per frame, suppressed units, blank penalty).
        fusion: a language model's weighted scores (``LanguageModelFusion``), added to every label's (shallow
            fusion); the scores are then fused scores, and a finished hypothesis adds the LM's ``</s>`` score.
    """

    @torch.no_grad()
    def __init__(self, model, batch: int, device: torch.device, beam: int, settings: SearchSettings = SearchSettings(),
                 fusion: LanguageModelFusion | None = None):
        settings.check(model.blank)
        if beam < 1:
            raise ValueError(f"need beam >= 1, got beam={beam}")
        super().__init__(batch)
        self.model, self.beam, self.settings, self.fusion = model, beam, settings, fusion
        # every prefix in play has a row of predictor state here
        self.bank = PredictorBank(*start_predictor(model, 1, device))
        lm_rows = fusion.start(batch) if fusion is not None else [-1] * batch
        # hypotheses share their prefixes (prefix_tree): extending one costs the same whatever its length
        self.beams = [[Prefix(Labels(), 0.0, 0.0, Chain(), Chain(), 0, lm_rows[b])] for b in range(batch)]

    @torch.no_grad()
    def advance(self, encoder_out: Tensor, encoder_lengths: Tensor | None = None) -> None:
        """Search the next frames: ``encoder_out`` ``B x n x D``; ``encoder_lengths`` ``B``: how many of them each
        utterance has (default all ``n``). Frame numbers in the hypotheses count each utterance's frames from the
        first call."""
        lengths = self._chunk_lengths(encoder_out, encoder_lengths)
        encoder_proj = self.model.joiner.encoder_proj(encoder_out)
        for t in range(max(lengths, default=0)):
            live = [b for b in range(len(self.beams)) if lengths[b] > t]
            finished = self._search_frame(encoder_proj[:, t], live, [done + t for done in self.frames_done])
            for b in live:
                self.beams[b] = sorted(finished[b].values(), key=lambda p: -p.score)[:self.beam]
            self._compact()
        self._chunk_done(lengths)

    def _search_frame(self, encoder_rows: Tensor, live: list[int],
                      frame_numbers: list[int]) -> dict[int, dict[Labels, Prefix]]:
        """Expand the ``live`` utterances' beams within one frame (``encoder_rows``: ``B x J``, its encoder
        projection; ``frame_numbers``: each utterance's number for it) -> for each, the prefixes that left the frame
        by their labels."""
        finished: dict[int, dict[Labels, Prefix]] = {b: {} for b in live}
        frontier = [(b, prefix) for b in live for prefix in self.beams[b]]  # grouped by utterance
        for _ in range(self.settings.max_symbols_per_frame):
            log_probs = self._score(encoder_rows, frontier)
            for (b, prefix), blank_score in zip(frontier, log_probs[:, self.model.blank].tolist()):
                leave_frame(finished[b], prefix, blank_score)  # the LM does not score blanks
            # the beam-th best score of each utterance's prefixes already out of the frame: labels only lower a score
            floors = {b: kth_best(finished[b], self.beam) for b in dict.fromkeys(b for b, _ in frontier)}
            if self.fusion is not None:
                log_probs = self._fuse(frontier, log_probs, floors)
            chosen = self._choose(frontier, log_probs, floors)
            frontier = self._extend(frontier, chosen, log_probs, frame_numbers)
            if not frontier:
                break
        for b, prefix in frontier:  # at the limit: on to the next frame, no blank scored
            leave_frame(finished[b], prefix, 0.0)
        return finished

    def _score(self, encoder_rows: Tensor, frontier: list[tuple[int, Prefix]]) -> Tensor:
        """The ``N x V`` transducer log-probabilities of the next unit of each prefix of the frontier."""
        device = encoder_rows.device
        utterances = torch.tensor([b for b, _ in frontier], device=device)
        rows = torch.tensor([prefix.row for _, prefix in frontier], device=device)
        return joint_log_probs(self.model, encoder_rows[utterances], self.bank.proj[rows], self.settings.blank_penalty)

    def _fuse(self, frontier: list[tuple[int, Prefix]], log_probs: Tensor, floors: dict[int, float]) -> Tensor:
        """The fused ``N x V`` log-probabilities of the labels of the prefixes that may still extend, -inf for the
        others (their blanks are scored already).

        A prefix whose best label, raised by the most the fusion may add to it (``fusion.gain_bounds``: the LM's
        own share is at most 0), cannot beat the ``beam``-th prefix already out of the frame (``floors``) chooses no
        label whatever the LM says (``_choose``), so its LM scores are not asked for, and an LM step that waits for
        them (``LanguageModelFusion.advance``) runs only if a later round or frame needs it. The bound is computed in
        float32 as the fused scores are, so it holds after rounding."""
        device = log_probs.device
        labels = selectable(log_probs, self.settings.suppress)
        labels = labels.clone() if labels is log_probs else labels
        labels[:, self.model.blank] = -math.inf
        best = labels.max(1).values
        gains = self.fusion.gain_bounds([prefix.lm_row for _, prefix in frontier])
        if gains is not None:  # a constant per row: the same as the best of the raised labels, rounded alike
            best = best + gains.to(device)
        extending = [i for i, ((b, prefix), label) in enumerate(zip(frontier, best.tolist()))
                     if prefix.score + label > floors[b]]
        if len(extending) == len(frontier):
            return log_probs + self.fusion.scores([prefix.lm_row for _, prefix in frontier], device)
        fused = torch.full_like(log_probs, -math.inf)
        if extending:
            index = torch.tensor(extending, device=device)
            fused[index] = log_probs[index] + self.fusion.scores([frontier[i][1].lm_row for i in extending], device)
        return fused

    def _choose(self, frontier: list[tuple[int, Prefix]], log_probs: Tensor,
                floors: dict[int, float]) -> list[_Expansion]:
        """The ``beam`` best (prefix, label) pairs of each utterance of the frontier.

        Pairs that score below the beam-th best prefix already out of the frame (``floors``, by utterance) are
        dropped: labels only lower a score."""
        vocab = log_probs.shape[1]
        scores = torch.tensor([prefix.score for _, prefix in frontier], dtype=torch.float64, device=log_probs.device)
        scores = scores.unsqueeze(1) + selectable(log_probs, self.settings.suppress).double()
        scores[:, self.model.blank] = -math.inf
        chosen: list[_Expansion] = []
        start = 0
        while start < len(frontier):
            b = frontier[start][0]
            end = start
            while end < len(frontier) and frontier[end][0] == b:
                end += 1
            floor = floors[b]
            segment = scores[start:end].flatten()
            top_scores, top_index = segment.topk(min(self.beam, segment.numel()))
            for score, index in zip(top_scores.tolist(), top_index.tolist()):
                if score <= floor:
                    break
                chosen.append(_Expansion(start + index // vocab, index % vocab, score))
            start = end
        return chosen

    def _extend(self, frontier: list[tuple[int, Prefix]], chosen: list[_Expansion], log_probs: Tensor,
                frame_numbers: list[int]) -> list[tuple[int, Prefix]]:
        """The new frontier: each chosen prefix extended by its label at its utterance's frame number; the new
        prefixes' predictor states (one batched step, added to the bank) and LM states (``fusion.advance``)."""
        if not chosen:
            return []
        device = log_probs.device
        labels = [expansion.label for expansion in chosen]
        parents = [frontier[expansion.index] for expansion in chosen]
        label_scores = log_probs[torch.tensor([e.index for e in chosen], device=device),
                                 torch.tensor(labels, device=device)].tolist()
        first = self.bank.extend(self.model, [prefix.row for _, prefix in parents], labels)
        lm_rows = ([-1] * len(chosen) if self.fusion is None else
                   self.fusion.advance([prefix.lm_row for _, prefix in parents], labels))
        return [(b, Prefix(parent.tokens.append(expansion.label), expansion.score, parent.path_score + label_score,
                            parent.token_scores.append(label_score), parent.frames.append(frame_numbers[b]), first + n,
                            lm_row))
                for n, ((b, parent), expansion, label_score, lm_row) in enumerate(zip(parents, chosen, label_scores,
                                                                                      lm_rows))]

    def _compact(self) -> None:
        """Keep only the bank rows (and the fusion's LM rows) that the beams use, and renumber the prefixes."""
        new_row = self.bank.keep([prefix.row for prefixes in self.beams for prefix in prefixes])
        new_lm_row = ({-1: -1} if self.fusion is None else
                      self.fusion.keep([p.lm_row for prefixes in self.beams for p in prefixes]))
        self.beams = [[p._replace(row=new_row[p.row], lm_row=new_lm_row[p.lm_row]) for p in prefixes]
                      for prefixes in self.beams]

    def partial(self, length_norm: float = 0.0) -> list[Hypothesis]:
        """The best hypothesis so far of each utterance, ranked as ``finish`` ranks with ``length_norm``
        (``ranking_score``; without the LM's ``</s>`` score)."""
        return [_hypothesis(max(prefixes, key=lambda p: ranking_score(p.score, len(p.tokens), length_norm)))
                for prefixes in self.beams]

    @torch.no_grad()
    def finish(self, nbest: int = 1, length_norm: float = 0.0) -> list[list[Hypothesis]]:
        """The utterances end here: for each, its ``nbest`` hypotheses (<= beam), best first, ranked by
        ``score / (len + 1) ** length_norm`` (``ranking_score``; the scores themselves are unchanged)."""
        if not 1 <= nbest <= self.beam:
            raise ValueError(f"need 1 <= nbest <= beam; got beam={self.beam}, nbest={nbest}")
        self._finishing()
        beams = self.beams if self.fusion is None else _finish(self.beams, self.fusion)
        return [[_hypothesis(p) for p in sorted(prefixes, key=lambda p: -ranking_score(p.score, len(p.tokens),
                                                                                         length_norm))[:nbest]]
                for prefixes in beams]


def _hypothesis(prefix: Prefix) -> Hypothesis:
    return Hypothesis(list(prefix.tokens), prefix.score, list(prefix.token_scores), list(prefix.frames))


def beam_search(
    model, encoder_out: Tensor, encoder_lengths: Tensor, beam: int,
    max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME, nbest: int = 1, suppress: Sequence[int] = (),
    length_norm: float = 0.0, blank_penalty: float = 0.0, fusion: LanguageModelFusion | None = None,
) -> list[list[Hypothesis]]:
    """Beam search (``BeamSearch``; the arguments of its ``SearchSettings`` are given here one by one) over a whole
    batch: ``encoder_out`` ``B x T x D`` and ``encoder_lengths`` ``B`` valid frames per utterance. Returns, for each
    utterance, its ``nbest`` hypotheses, best first, ranked by ``score / (len + 1) ** length_norm``
    (``ranking_score``)."""
    if beam < 1 or not 1 <= nbest <= beam:
        raise ValueError(f"need beam >= 1 and 1 <= nbest <= beam; got beam={beam}, nbest={nbest}")
    settings = SearchSettings(max_symbols_per_frame, tuple(suppress), blank_penalty)
    search = BeamSearch(model, encoder_out.shape[0], encoder_out.device, beam, settings, fusion)
    search.advance(encoder_out, encoder_lengths)
    return search.finish(nbest, length_norm)


def _finish(beams: list[list[Prefix]], fusion: LanguageModelFusion) -> list[list[Prefix]]:
    """The prefixes of finished utterances with the LM's ``</s>`` score added (0 without ``--lm-eos``), the LM steps
    they wait for run together."""
    eos = iter(fusion.eos_scores([p.lm_row for prefixes in beams for p in prefixes]))
    return [[p._replace(score=p.score + e, path_score=p.path_score + e) for p, e in zip(prefixes, eos)]
            for prefixes in beams]
