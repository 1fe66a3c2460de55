"""Shallow fusion of a fairseq language model into transducer search.

Every label a hypothesis emits scores ``log p_asr(label) + weight * log p_lm(label | labels so far)``; blanks are not
scored by the LM; a finished hypothesis adds ``weight * log p_lm(</s> | labels)`` (``eos``). The LM reads the
transducer's units, and its context starts with ``</s>``, as fairseq's language models see a sentence start in
their training streams (fairseq-eval-lm and fairseq's own LM generation start the same way).

LM states (``lm_states.LanguageModelStates``): the hypotheses' incremental states are gathered and concatenated so
that all the rows a search extends in one round step in one LM call where their states allow (an LM with a
fixed-size state: always; ``transformer_lm`` and ``spade_lm``, whose states grow with the prefix: one call per
prefix length), each with exactly its own labels, as the full forward pass over them would see them. Each row keeps
its weighted log-probabilities over the whole vocabulary, so a later expansion's LM score is a lookup. At weight 0
the LM is never run.

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
from .lm_states import LanguageModelStates


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

    Rows are plain integers; ``keep`` renumbers them (call it when the search drops hypotheses). Each row's weighted
    log-probabilities over the whole vocabulary are kept from the LM step that made it, so scoring any expansion of
    it is a lookup; ``advance`` steps all the rows asked for in as few LM calls as their states allow
    (``LanguageModelStates``): one for an LM with a fixed-size state, one per prefix length for the others.
    """

    def __init__(self, lm, weight: float, blank: int, eos: int, add_eos: bool = True, ilm: BigramLM | None = None,
                 ilm_weight: float = 0.0):
        check_lm_weight(weight)
        check_ilm_weight(ilm_weight)
        if ilm_weight and (ilm is None or not weight):
            raise ValueError(f"--ilm-weight {ilm_weight} needs a bigram (--ilm-path) and a fused LM with a weight "
                             f"above 0 (--lm-path, --lm-weight): LODR corrects shallow fusion")
        self.lm, self.weight, self.blank, self.eos, self.add_eos = lm, weight, blank, eos, add_eos
        self.states = LanguageModelStates(lm, lm.decoder.dictionary.pad()) if weight else None
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
        self._scores = torch.zeros(0, vocab, device=self.device)
        self._eos = torch.zeros(0, device=self.device)
        self._count = 0

    def start(self, count: int) -> list[int]:
        """``count`` new rows of the empty hypothesis (the LM fed ``</s>``)."""
        log_probs = None if self.states is None else self.states.start((self.eos,), count)
        return self._add(count, log_probs, [self.eos] * count)

    def scores(self, rows: Sequence[int], device: torch.device | None = None) -> Tensor:
        """``N x V`` weighted next-unit log-probabilities of ``rows`` (the blank's column is 0), float32."""
        out = self._scores[torch.tensor(rows, dtype=torch.long, device=self.device)]
        return out if device is None else out.to(device)

    def advance(self, rows: Sequence[int], labels: Sequence[int]) -> list[int]:
        """New rows: ``rows[i]`` followed by ``labels[i]``, stepped in as few LM calls as their states allow."""
        log_probs = None if self.states is None else self.states.advance(rows, labels)
        return self._add(len(rows), log_probs, labels)

    def eos_scores(self, rows: Sequence[int]) -> list[float]:
        """``W * log p_lm(</s> | labels)`` of each row, or zeros without ``add_eos``."""
        if not self.add_eos:
            return [0.0] * len(rows)
        return self._eos[torch.tensor(rows, dtype=torch.long, device=self.device)].tolist()

    def keep(self, rows: Sequence[int]) -> dict[int, int]:
        """Drop every row but ``rows`` -> {old row: new row}. The rows are renumbered (and the LM states of the
        others freed) once at least half of them are dropped ones; until then each row keeps its number."""
        kept = sorted(set(rows))
        if 2 * len(kept) > self._count:
            return {row: row for row in kept}
        index = torch.tensor(kept, dtype=torch.long, device=self.device)
        self._scores, self._eos = self._scores[index], self._eos[index]
        self._count = len(kept)
        if self.states is not None:
            self.states.keep(kept)
        return {row: new for new, row in enumerate(kept)}

    def _add(self, count: int, log_probs: Tensor | None, last: Sequence[int]) -> list[int]:
        """Rows for ``count`` new LM states with ``count x V`` ``log_probs`` (None: the LM is not run), after the
        labels ``last`` (``</s>`` at the start)."""
        first = self._count
        if first + count > self._scores.shape[0]:  # room for twice as many rows
            room = max(2 * (first + count), 16) - first
            self._scores = torch.cat([self._scores[:first], self._scores.new_zeros(room, self._scores.shape[1])])
            self._eos = torch.cat([self._eos[:first], self._eos.new_zeros(room)])
        if log_probs is not None and count:
            weighted = log_probs * self.weight
            self._check_finite(log_probs, weighted)
            self._eos[first:first + count] = weighted[:, self.eos]
            if self._ilm is not None:
                weighted -= self._ilm[torch.tensor(last, dtype=torch.long, device=self.device)]
            weighted[:, self.blank] = 0.0
            self._scores[first:first + count] = weighted
        self._count += count
        return list(range(first, first + count))

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
