"""A bigram of the training transcripts' units: the internal-LM estimate that LODR subtracts in fusion.

LODR (low-order density ratio, icefall's ``modified_beam_search_LODR``): with shallow fusion each emitted unit scores
``log p_asr + W * log p_lm(unit | units so far) - W_ilm * log p_bigram(unit | previous unit)``. The transducer's
predictor has learned the statistics of its training transcripts (an internal LM), which the fused LM would count a
second time; a bigram of those transcripts estimates it. The first unit's previous unit is ``</s>`` (a sentence's
start, as the fused LM's context starts). ``</s>`` is a bigram outcome too (a transcript's end), so that each row is a
distribution over what follows, but fusion subtracts nothing at the end: the transducer emits no ``</s>``.

Add-k smoothing (``k > 0``, so that every log-probability is finite)::

    P(w | v) = (c(v, w) + k) / (c(v) + k |O|)

``c(v, w)``: how often unit ``w`` follows ``v`` in the transcripts (``</s>`` before each and after each); ``c(v)``:
how often ``v`` is followed by anything; ``O``: the outcomes, every unit of the dictionary but ``<s>`` (the
transducer's blank), ``<pad>`` and ``<unk>``, with ``</s>``.

File (``save`` / ``load``): JSON with the dictionary's units in order (checked against the transducer's when
loaded), ``k`` and the nonzero counts as ``[v, w, c(v, w)]`` triples (its size grows with the pairs seen, not with
``V ** 2``). In memory the search keeps a dense ``V x V`` float32 table (64 KiB at the mini corpus's 128 units,
64 MiB at LibriSpeech's 4096).
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Iterable, Sequence

import torch
from torch import Tensor

FORMAT = "ssm_fairseq bigram 1"
EXCLUDED = ("<s>", "<pad>", "<unk>")  # never an outcome: the blank, padding, the unknown unit


class BigramFileError(ValueError):
    """A bigram file that cannot be read as one (named with the file)."""


class BigramLM:
    """Add-k bigram over a dictionary's units (see the module docstring).

    Args:
        units: the dictionary's symbols in index order (fairseq's ``Dictionary.symbols``).
        counts: ``{(v, w): c(v, w)}`` over unit indices, ``v`` or ``w`` ``eos`` at a sentence's ends.
        add_k: the smoothing constant, > 0.
        eos: the index of ``</s>``.
    """

    def __init__(self, units: Sequence[str], counts: dict[tuple[int, int], int], add_k: float, eos: int):
        if not math.isfinite(add_k) or add_k <= 0:
            raise ValueError(f"the bigram's add-k constant must be a finite number > 0, got {add_k}")
        self.units, self.counts, self.add_k, self.eos = list(units), dict(counts), add_k, eos
        self.outcomes = [i for i, unit in enumerate(self.units) if unit not in EXCLUDED]
        allowed = set(self.outcomes)
        for (v, w), count in self.counts.items():
            if v not in allowed or w not in allowed or count < 1:
                raise ValueError(f"bigram count c({v}, {w}) = {count}: each unit must be an outcome "
                                 f"(not one of {EXCLUDED}) and each count at least 1")
        self.context_counts: Counter = Counter()
        for (v, _), count in self.counts.items():
            self.context_counts[v] += count

    @classmethod
    def from_sequences(cls, sequences: Iterable[Sequence[int]], units: Sequence[str], add_k: float,
                       eos: int) -> "BigramLM":
        """The bigram of unit sequences (one per transcript, without ``</s>``: it is added at both ends)."""
        counts: Counter = Counter()
        for sequence in sequences:
            padded = [eos, *sequence, eos]
            counts.update(zip(padded[:-1], padded[1:]))
        return cls(units, counts, add_k, eos)

    def log_prob(self, previous: int, unit: int) -> float:
        """``log P(unit | previous)``, natural log."""
        denominator = self.context_counts[previous] + self.add_k * len(self.outcomes)
        return math.log((self.counts.get((previous, unit), 0) + self.add_k) / denominator)

    def log_prob_table(self, device: torch.device | str = "cpu") -> Tensor:
        """``V x V`` float32: row ``v``, column ``w`` is ``log P(w | v)`` for outcomes ``v`` and ``w``, and 0 in the
        rows and columns of the excluded units (never a context or an emitted unit in search)."""
        size = len(self.units)
        counts = torch.zeros(size, size, dtype=torch.float64)
        if self.counts:
            pairs = torch.tensor(list(self.counts), dtype=torch.long)
            counts[pairs[:, 0], pairs[:, 1]] = torch.tensor(list(self.counts.values()), dtype=torch.float64)
        outcomes = torch.tensor(self.outcomes, dtype=torch.long)
        table = torch.zeros(size, size, dtype=torch.float64)
        rows = counts[outcomes][:, outcomes] + self.add_k
        table[outcomes[:, None], outcomes[None, :]] = (rows / rows.sum(1, keepdim=True)).log()
        return table.float().to(device)

    def save(self, path: str | Path) -> None:
        """Write the JSON file ``load`` reads."""
        data = {"format": FORMAT, "units": self.units, "eos": self.eos, "add_k": self.add_k,
                "counts": [[v, w, c] for (v, w), c in sorted(self.counts.items())]}
        Path(path).write_text(json.dumps(data, ensure_ascii=False))

    @classmethod
    def load(cls, path: str | Path) -> "BigramLM":
        """Read a file ``save`` wrote (``BigramFileError`` naming the file if it is not one)."""
        try:
            data = json.loads(Path(path).read_text())
            if data.get("format") != FORMAT:
                raise BigramFileError(f"{path}: not a bigram file of this package (format {data.get('format')!r}, "
                                      f"expected {FORMAT!r}; write one with scripts/build_bigram.py)")
            counts = {(int(v), int(w)): int(c) for v, w, c in data["counts"]}
            return cls(data["units"], counts, float(data["add_k"]), int(data["eos"]))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            if isinstance(error, BigramFileError):
                raise
            raise BigramFileError(f"{path}: cannot read it as a bigram file ({error})") from error

    def dictionary(self) -> SimpleNamespace:
        """Its units as ``lm_fusion.check_same_units`` compares them (an object with ``symbols``)."""
        return SimpleNamespace(symbols=self.units)


def check_ilm_weight(weight: float) -> None:
    """Refuse an internal-LM weight that is not a finite number >= 0."""
    if not math.isfinite(weight) or weight < 0:
        raise ValueError(f"--ilm-weight must be a finite number >= 0 (typically below --lm-weight), got {weight}")
