"""Shallow fusion of a fairseq language model into transducer search.

Every label a hypothesis emits scores ``log p_asr(label) + weight * log p_lm(label | labels so far)``; blanks are not
scored by the LM; a finished hypothesis adds ``weight * log p_lm(</s> | labels)`` (``eos``). The LM reads the
transducer's units, and its context starts with ``</s>``, as fairseq's language models see a sentence start in
their training streams (fairseq-eval-lm and fairseq's own LM generation start the same way).

LM states: fairseq's incremental decoders (``transformer_lm``, ``lstm_lm``, ``spade_lm``) keep one cache per batch
row, and the rows of one incremental state step together, so they all hold prefixes of one length. The hypotheses
of a search have different lengths, so the states are kept in groups: a group is one incremental state whose rows
were advanced together, and a row of the bank is (group, index in it). Advancing a set of rows takes one LM step
per group they come from, on a copy of that group's state reordered to the rows asked for (fairseq's
``reorder_incremental_state``, as its beam search uses it); each row's LM step therefore sees exactly the labels
of its hypothesis, as the full forward pass over them would.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor


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


@dataclass
class _Group:
    """Rows whose LM states stepped together: an incremental state, the labels fed (``n x l``, ``</s>`` first),
    the weighted next-unit log-probabilities ``n x V`` (blank column 0) and the weighted ``</s>`` ones ``n``."""

    state: dict
    tokens: Tensor
    scores: Tensor
    eos: Tensor


def _copy_structure(value: Any) -> Any:
    """A copy of nested dicts, lists and tuples sharing their tensors: fairseq's reorders replace the tensors of
    a state (``index_select``), so reordering the copy leaves the original as it was."""
    if isinstance(value, dict):
        return {key: _copy_structure(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_structure(item) for item in value)
    return value


class LanguageModelFusion:
    """A fairseq language model's scores for the hypotheses of one transducer search.

    Args:
        lm: a ``FairseqLanguageModel`` with an incremental decoder, over the transducer's units.
        weight: the LM weight ``W`` of the fused score, finite and >= 0 (``check_lm_weight``); ``W * log p_lm`` must
            be a finite float32 too, else the step that meets it raises ``LanguageModelWeightError``.
        blank: the transducer's blank, which the LM never scores (its column of ``scores`` is 0).
        eos: the dictionary's ``</s>``: the LM's first input, and the unit whose probability ends a hypothesis.
        add_eos: whether ``eos_scores`` adds ``W * log p_lm(</s> | labels)`` (``--lm-eos``); 0 when False.

    Rows are plain integers; ``keep`` renumbers them (call it when the search drops hypotheses).
    """

    def __init__(self, lm, weight: float, blank: int, eos: int, add_eos: bool = True):
        check_lm_weight(weight)
        self.lm, self.weight, self.blank, self.eos, self.add_eos = lm, weight, blank, eos, add_eos
        self.device = next(lm.parameters()).device
        self._rows: list[tuple[_Group, int]] = []

    def start(self, count: int) -> list[int]:
        """``count`` new rows of the empty hypothesis (the LM fed ``</s>``)."""
        tokens = torch.full((count, 1), self.eos, dtype=torch.long, device=self.device)
        group = self._step(tokens, {})
        return self._add(group)

    def scores(self, rows: Sequence[int], device: torch.device | None = None) -> Tensor:
        """``N x V`` weighted next-unit log-probabilities of ``rows`` (the blank's column is 0), float32."""
        out = torch.stack([group.scores[index] for group, index in (self._rows[row] for row in rows)])
        return out if device is None else out.to(device)

    def advance(self, rows: Sequence[int], labels: Sequence[int]) -> list[int]:
        """New rows: ``rows[i]`` followed by ``labels[i]``, one LM step per group the rows come from."""
        new_rows: list[int] = [-1] * len(rows)
        by_group: dict[int, tuple[_Group, list[int]]] = {}
        for position, row in enumerate(rows):
            group = self._rows[row][0]
            by_group.setdefault(id(group), (group, []))[1].append(position)
        for group, positions in by_group.values():
            index = torch.tensor([self._rows[rows[p]][1] for p in positions], device=self.device)
            label = torch.tensor([labels[p] for p in positions], device=self.device)
            state = _copy_structure(group.state)
            self.lm.decoder.reorder_incremental_state_scripting(state, index)
            for position, row in zip(positions, self._add(self._step(
                    torch.cat([group.tokens[index], label.unsqueeze(1)], 1), state))):
                new_rows[position] = row
        return new_rows

    def eos_scores(self, rows: Sequence[int]) -> list[float]:
        """``W * log p_lm(</s> | labels)`` of each row, or zeros without ``add_eos``."""
        if not self.add_eos:
            return [0.0] * len(rows)
        return [group.eos[index].item() for group, index in (self._rows[row] for row in rows)]

    def keep(self, rows: Sequence[int]) -> dict[int, int]:
        """Drop every row but ``rows`` -> {old row: new row}. Groups shrink to the rows kept (in place)."""
        places = {row: self._rows[row] for row in sorted(set(rows))}
        by_group: dict[int, tuple[_Group, set[int]]] = {}
        for group, index in places.values():
            by_group.setdefault(id(group), (group, set()))[1].add(index)
        self._rows, new_row = [], {}
        for group, used in by_group.values():
            indices = sorted(used)
            if len(indices) < group.tokens.shape[0]:
                index = torch.tensor(indices, device=self.device)
                self.lm.decoder.reorder_incremental_state_scripting(group.state, index)
                group.tokens, group.scores, group.eos = group.tokens[index], group.scores[index], group.eos[index]
            for n, old_index in enumerate(indices):
                new_row[id(group), old_index] = len(self._rows)
                self._rows.append((group, n))
        return {row: new_row[id(group), index] for row, (group, index) in places.items()}

    @torch.no_grad()
    def _step(self, tokens: Tensor, state: dict) -> _Group:
        """Feed the last column of ``tokens`` (``n x l``, the whole prefixes, as fairseq's incremental decoders
        take them) to the LM with ``state`` -> the group of the new rows."""
        out = self.lm.decoder(tokens, incremental_state=state)
        log_probs = self.lm.get_normalized_probs(out, log_probs=True)[:, -1].float()
        weighted = log_probs * self.weight if self.weight else torch.zeros_like(log_probs)
        self._check_finite(log_probs, weighted)
        eos = weighted[:, self.eos].clone()
        weighted[:, self.blank] = 0.0
        return _Group(state, tokens, weighted, eos)

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

    def _add(self, group: _Group) -> list[int]:
        first = len(self._rows)
        self._rows.extend((group, index) for index in range(group.tokens.shape[0]))
        return list(range(first, len(self._rows)))
