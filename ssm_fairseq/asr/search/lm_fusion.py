"""Shallow fusion of a fairseq language model into transducer search.

Every label a hypothesis emits scores ``log p_asr(label) + weight * log p_lm(label | labels so far)``; blanks are not
scored by the LM; a finished hypothesis adds ``weight * log p_lm(</s> | labels)`` (``eos``). The LM reads the
transducer's units, and its context starts with ``</s>``, as fairseq's language models see a sentence start in
their training streams (fairseq-eval-lm and fairseq's own LM generation start the same way).

LM states (``lm_states.LanguageModelStates``): the hypotheses' incremental states are gathered and concatenated so
that all the rows a search extends in one round step in one LM call where their states allow (an LM with a
fixed-size state: always; ``transformer_lm``, whose keys and values grow with the prefix: one call per prefix
length), each with exactly its own labels, as the full forward pass over them would see them. ``spade_lm`` keeps its
rows in a token store instead (``text/token_store.py``: each token's keys stored once, a row's attention window a
list of indices into them), so its rows step in one call whatever their lengths and no branch copies keys. Each row
keeps its weighted log-probabilities over the whole vocabulary, so a later expansion's LM score is a lookup. A row's
LM step runs when its scores are first asked for (``scores``, ``eos_scores``), all the rows waiting then in one
step: a hypothesis that the search drops before it needs them (beam search asks only for the rows that may still
extend) never runs the LM. At weight 0 the LM is never run.

LODR (``ilm``, ``ilm_weight``): each emitted label also scores ``- W_ilm * log p_bigram(label | previous label)``, a
bigram of the training transcripts estimating the transducer's internal LM (``bigram_lm``); the first label's previous
one is ``</s>``. It joins the same per-row table (the bigram row of the row's last label), so it costs a lookup too;
the end of a hypothesis is not corrected (the transducer emits no ``</s>``).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from .bigram_lm import BigramLM, check_ilm_weight
from .lm_states import language_model_states


class LanguageModelMismatchError(ValueError):
    """A language model over other units than the transducer's."""


class NotALanguageModelError(ValueError):
    """An ``--lm-path`` model that is not a fairseq language model (e.g. a transducer checkpoint)."""


class LanguageModelWeightError(ValueError):
    """An LM weight that fusion cannot use: negative, not finite, or so large that the fused scores overflow."""


PADDING_SYMBOL = "madeupword"  # fairseq-preprocess pads a dictionary it builds with madeupword0000, 0001, ...


def check_lm_weight(weight: float) -> None:
    """Refuse an LM weight that is not a finite number >= 0 (a negative weight rewards what the LM finds unlikely)."""
    if not math.isfinite(weight) or weight < 0:
        raise LanguageModelWeightError(f"--lm-weight must be a finite number >= 0 (typically 0.1 to 1), got {weight}")


def _padding_note(longer: Sequence[str], shorter_name: str, common: int) -> str:
    """Why ``longer`` has units beyond the first ``common``, when they are fairseq-preprocess's padding."""
    extra = longer[common:]
    if not all(symbol.startswith(PADDING_SYMBOL) for symbol in extra):
        return f"; its unit {common} is {extra[0]!r}, which {shorter_name} lacks"
    return (f"; the rest are {len(extra)} {PADDING_SYMBOL} symbols, which fairseq-preprocess adds when it builds a "
            f"dictionary (to a multiple of --padding-factor, 8 by default), and fairseq-generate cannot load the LM "
            f"with the transducer's dictionary (--srcdict is not padded)")


def check_is_language_model(lm, lm_name: str = "the language model") -> None:
    """Refuse a model without the incremental decoder over a dictionary that fusion steps (``lm.decoder``)."""
    if not hasattr(getattr(lm, "decoder", None), "dictionary"):
        raise NotALanguageModelError(f"{lm_name} is a {type(lm).__name__}, not a fairseq language model (one with a "
                                     f"decoder over a dictionary, e.g. transformer_lm or spade_lm)")


def check_same_units(lm_dictionary, asr_dictionary, lm_name: str = "the language model",
                     remedy: str = "fairseq-preprocess --only-source --srcdict DATA/dict.txt") -> None:
    """Refuse an LM whose dictionary is not the transducer's, naming the first differing unit (its index and both
    symbols) and both sizes if they differ; ``remedy`` says how to binarise the LM's text instead."""
    lm_units, asr_units = list(lm_dictionary.symbols), list(asr_dictionary.symbols)
    if lm_units == asr_units:
        return
    advice = f": fusion needs an LM trained over the transducer's dictionary ({remedy})"
    common = min(len(lm_units), len(asr_units))
    first = next((i for i in range(common) if lm_units[i] != asr_units[i]), None)
    if first is not None:
        sizes = (f" ({len(lm_units)} units, the transducer {len(asr_units)})"
                 if len(lm_units) != len(asr_units) else "")
        raise LanguageModelMismatchError(
            f"{lm_name}'s unit {first} is {lm_units[first]!r} where the transducer's is {asr_units[first]!r}{sizes}"
            f"{advice}")
    note = (_padding_note(lm_units, "the transducer's", common) if len(lm_units) > common
            else _padding_note(asr_units, "the LM's", common))
    raise LanguageModelMismatchError(
        f"{lm_name} has {len(lm_units)} units and the transducer {len(asr_units)}, the first {common} the same"
        f"{note}{advice}")


class LanguageModelFusion:
    """A fairseq language model's scores for the hypotheses of one transducer search.

    Args:
        lm: a ``FairseqLanguageModel`` with an incremental decoder, over the transducer's units.
        weight: the LM weight ``W`` of the fused score, finite and >= 0 (``check_lm_weight``); ``W * log p_lm`` must
            be a finite float32 too, else the step that meets it raises ``LanguageModelWeightError``. At 0 the LM is
            never run: every score is 0.
        blank: the transducer's blank, which the LM never scores (its column of ``scores`` is 0).
        eos: the dictionary's ``</s>``: the LM's first input, and the unit whose probability ends a hypothesis.
        add_eos: whether ``eos_scores`` adds ``W * log p_lm(</s> | labels)`` (``--lm-eos``); 0 when False.
        ilm, ilm_weight: LODR's internal-LM estimate (a ``BigramLM`` over the same units) and its weight ``W_ilm``
            (finite, >= 0; above 0 only with a weight ``W`` above 0): every label's score is lowered by
            ``W_ilm * log p_bigram(label | previous label)``.

    Rows are plain integers; ``keep`` renumbers them (call it when the search drops hypotheses). ``advance`` makes
    rows whose LM step waits until their scores are first asked for; then all the waiting rows asked for step in as
    few LM calls as their states allow (``lm_states.language_model_states``: one for an LM with a fixed-size state
    and ``spade_lm``, one per prefix length for the others). Each row's weighted log-probabilities over the whole
    vocabulary are kept from its step, so scoring any expansion of it is a lookup.
    """

    def __init__(self, lm, weight: float, blank: int, eos: int, add_eos: bool = True, ilm: BigramLM | None = None,
                 ilm_weight: float = 0.0):
        check_lm_weight(weight)
        check_ilm_weight(ilm_weight)
        if ilm_weight and (ilm is None or not weight):
            raise ValueError(f"--ilm-weight {ilm_weight} needs a bigram (--ilm-path) and a fused LM with a weight "
                             f"above 0 (--lm-path, --lm-weight): LODR corrects shallow fusion")
        self.lm, self.weight, self.blank, self.eos, self.add_eos = lm, weight, blank, eos, add_eos
        self.states = language_model_states(lm, lm.decoder.dictionary.pad()) if weight else None
        self.device = next(lm.parameters()).device
        vocab = len(lm.decoder.dictionary)
        # W_ilm * log p_bigram(next | previous), V x V (row: the previous label), or None without LODR
        self._ilm = None
        if ilm_weight:
            check_same_units(ilm.dictionary(), lm.decoder.dictionary, "the --ilm-path bigram",
                             "scripts/build_bigram.py --data DATA, with the transducer's data directory")
            self._ilm = ilm_weight * ilm.log_prob_table(self.device)
        # the rows' weighted next-unit log-probabilities (blank column 0) and weighted log p_lm(</s> | labels), in
        # buffers with room for more rows
        # the most LODR's correction adds to any unit's score after each previous unit (0 without LODR), V
        self._gain = None if self._ilm is None else (-self._ilm).max(1).values
        # the rows' weighted next-unit log-probabilities (blank column 0) and weighted log p_lm(</s> | labels), in
        # buffers with room for more rows; each row's last label, and its LM state's row in ``states`` (-1 while its
        # step waits: ``_waiting`` then holds its parent's state row and its label)
        self._scores = torch.zeros(0, vocab, device=self.device)
        self._eos = torch.zeros(0, device=self.device)
        self._last: list[int] = []
        self._state_rows: list[int] = []
        self._waiting: dict[int, tuple[int, int]] = {}

    def start(self, count: int) -> list[int]:
        """``count`` new rows of the empty hypothesis (the LM fed ``</s>``), stepped at once."""
        rows = self._add([self.eos] * count)
        if self.states is not None:
            first = len(self.states)
            self._set(rows, self.states.start((self.eos,), count), range(first, first + count))
        return rows

    def scores(self, rows: Sequence[int], device: torch.device | None = None) -> Tensor:
        """``N x V`` weighted next-unit log-probabilities of ``rows`` (the blank's column is 0), float32; the rows
        whose LM step waits step first, together."""
        self._step(rows)
        out = self._scores[torch.tensor(rows, dtype=torch.long, device=self.device)]
        return out if device is None else out.to(device)

    def gain_bounds(self, rows: Sequence[int]) -> Tensor | None:
        """``N``, float32: for each row, the most its fused scores may add to any unit's log-probability, known
        without running the LM: with LODR the largest ``- W_ilm log p_bigram(unit | its last label)``; None without
        LODR, where it is 0 (the LM's own ``W log p_lm`` is at most 0)."""
        if self._gain is None:
            return None
        return self._gain[torch.tensor([self._last[row] for row in rows], dtype=torch.long, device=self.device)]

    def advance(self, rows: Sequence[int], labels: Sequence[int]) -> list[int]:
        """New rows: ``rows[i]`` followed by ``labels[i]``. Their LM step waits until their scores are asked for
        (``rows`` whose own step waits step now, together)."""
        new = self._add(labels)
        if self.states is not None:
            self._step(rows)
            for row, parent, label in zip(new, rows, labels):
                self._waiting[row] = self._state_rows[parent], label
        return new

    def eos_scores(self, rows: Sequence[int]) -> list[float]:
        """``W * log p_lm(</s> | labels)`` of each row, or zeros without ``add_eos``."""
        if not self.add_eos:
            return [0.0] * len(rows)
        self._step(rows)
        return self._eos[torch.tensor(rows, dtype=torch.long, device=self.device)].tolist()

    def keep(self, rows: Sequence[int]) -> dict[int, int]:
        """Drop every row but ``rows`` -> {old row: new row}. The rows are renumbered (and the LM states no kept row
        needs freed) once at least half of them are dropped ones; until then each row keeps its number."""
        kept = sorted(set(rows))
        if 2 * len(kept) > len(self._last):
            return {row: row for row in kept}
        index = torch.tensor(kept, dtype=torch.long, device=self.device)
        self._scores, self._eos = self._scores[index], self._eos[index]
        self._last = [self._last[row] for row in kept]
        if self.states is not None:  # the states of the kept rows, and of the parents of those whose step waits
            waiting = [self._waiting.get(row) for row in kept]
            state_rows = [self._state_rows[row] if wait is None else wait[0] for row, wait in zip(kept, waiting)]
            used = sorted(set(state_rows))
            self.states.keep(used)
            renumber = {old: new for new, old in enumerate(used)}
            self._state_rows = [-1 if wait is not None else renumber[row] for row, wait in zip(state_rows, waiting)]
            self._waiting = {new: (renumber[wait[0]], wait[1]) for new, wait in enumerate(waiting) if wait is not None}
        else:
            self._state_rows = [-1] * len(kept)
        return {row: new for new, row in enumerate(kept)}

    def _step(self, rows: Sequence[int]) -> None:
        """Run the LM step of those of ``rows`` that wait for it, all in as few calls as their states allow."""
        if not self._waiting:
            return
        waiting = list(dict.fromkeys(row for row in rows if row in self._waiting))
        if not waiting:
            return
        parents, labels = zip(*(self._waiting.pop(row) for row in waiting))
        first = len(self.states)
        self._set(waiting, self.states.advance(parents, labels), range(first, first + len(waiting)))

    def _add(self, last: Sequence[int]) -> list[int]:
        """Rows for hypotheses whose last labels are ``last`` (``</s>`` at the start), without scores yet (zeros)."""
        first, count = len(self._last), len(last)
        if first + count > self._scores.shape[0]:  # room for twice as many rows
            room = max(2 * (first + count), 16) - first
            self._scores = torch.cat([self._scores[:first], self._scores.new_zeros(room, self._scores.shape[1])])
            self._eos = torch.cat([self._eos[:first], self._eos.new_zeros(room)])
        self._last.extend(last)
        self._state_rows.extend([-1] * count)
        return list(range(first, first + count))

    def _set(self, rows: Sequence[int], log_probs: Tensor, state_rows: Sequence[int]) -> None:
        """The LM's ``N x V`` ``log_probs`` for ``rows``, whose states are ``state_rows`` of ``states``: weighted (and
        LODR-corrected) into the rows' scores."""
        for row, state_row in zip(rows, state_rows):
            self._state_rows[row] = state_row
        if not rows:
            return
        weighted = log_probs * self.weight
        self._check_finite(log_probs, weighted)
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        self._eos[index] = weighted[:, self.eos]
        if self._ilm is not None:
            weighted -= self._ilm[torch.tensor([self._last[row] for row in rows], dtype=torch.long,
                                               device=self.device)]
        weighted[:, self.blank] = 0.0
        self._scores[index] = weighted

    def _check_finite(self, log_probs: Tensor, weighted: Tensor) -> None:
        """The rule for the weight: every fused score must be a finite float32, so ``weight * log p_lm`` must be;
        refuse, naming the weight (or the LM, if its own log-probabilities are NaN or inf), where it is not."""
        if torch.isfinite(weighted).all():
            return
        if not torch.isfinite(log_probs).all():
            raise LanguageModelWeightError("the language model computed NaN or inf log-probabilities: fusion cannot "
                                           "score with it (decode without --lm-path to check the transducer alone)")
        lowest = log_probs.min().item()
        raise LanguageModelWeightError(
            f"--lm-weight {self.weight} is too large: times the language model's log-probabilities (as low as "
            f"{lowest:.4g}) it gives fused scores beyond float32's range (inf); use a weight of the order of 0.1 to 1")
