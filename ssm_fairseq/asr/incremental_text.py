"""Incremental detokenization: a stream's partial transcript after each chunk, detokenizing only what changed.

After every chunk a stream shows its best hypothesis in words. Detokenizing the whole hypothesis each time
(``Recognizer.text``: fairseq's ``Dictionary.string`` with ``--post-process sentencepiece``) makes a chunk's text
cost grow with the segment. ``IncrementalText`` keeps the text of the hypothesis it gave last, unit by unit, and
for the next hypothesis reuses the text of the units both share from the start (the words already stable), so it
detokenizes only the units after them: the hypothesis's unstable tail, usually the last word or two. When the
search switches to a hypothesis that differs earlier, only the units after the first difference are detokenized.

The text is exactly ``Dictionary.string(units, "sentencepiece", extra_symbols_to_ignore)``: that joins the units'
strings by spaces, drops every space, turns each ``"▁"`` into a space and strips the ends. Dropping the separators
makes the text before the strip a plain concatenation of per-unit pieces (a unit's string without spaces, ``"▁"``
turned into a space; nothing for an ignored id, ``<unk>``'s own string for the unknown unit), so the text of a
shared prefix is a prefix of the text, and stripping the ends is done once on the whole.

Pure Python (no torch): the per-unit pieces are made once per recognizer (``unit_pieces``).
"""
from __future__ import annotations

from typing import Collection, Sequence

WORD_BOUNDARY = "\u2581"  # SentencePiece's "▁"


def unit_pieces(dictionary, ignored: Collection[int]) -> list[str]:
    """Each id of a fairseq ``dictionary`` -> its piece of text before the strip: the unit's string without spaces,
    ``"▁"`` turned into a space; ``""`` for the ``ignored`` ids and for ``</s>`` and ``<s>`` (which
    ``Dictionary.string`` drops), the dictionary's ``<unk>`` string for the unknown unit."""
    dropped = set(ignored) | {dictionary.eos(), dictionary.bos()}
    unk = dictionary.unk()
    pieces = []
    for index in range(len(dictionary)):
        if index in dropped:
            pieces.append("")
            continue
        pieces.append(unit_piece(dictionary.unk_string(False) if index == unk else dictionary[index]))
    return pieces


def unit_piece(unit: str) -> str:
    """A unit's string -> its piece of text before the strip: without spaces, ``"▁"`` turned into a space."""
    return unit.replace(" ", "").replace(WORD_BOUNDARY, " ")


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many items ``a`` and ``b`` share from their start (compared whole first: one C-level comparison when one
    continues the other, as a growing hypothesis continues the last)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class IncrementalText:
    """The text of one hypothesis after another (a stream's segment), reusing the last one's shared prefix.

    Args:
        pieces: ``unit_pieces`` of the dictionary (id -> piece), shared by every stream of a recognizer.

    ``units_detokenized`` counts the units whose pieces were looked up and joined (the work a chunk's text costs):
    a hypothesis that continues the last one costs its new units, one that differs from the ``i``-th unit on costs
    its units from ``i`` on.
    """

    def __init__(self, pieces: Sequence[str]):
        self.pieces = pieces
        self.units: list[int] = []  # the last hypothesis's units
        self.ends: list[int] = [0]  # ends[i]: length of the unstripped text of units[:i]
        self.unstripped = ""  # the last hypothesis's text before the strip
        self.units_detokenized = 0

    def text(self, units: Sequence[int]) -> str:
        """The hypothesis ``units`` (ids) -> its words, ``Dictionary.string(units, "sentencepiece", ignored)``."""
        units = list(units)
        shared = common_prefix_length(self.units, units)
        tail = [self.pieces[unit] for unit in units[shared:]]
        self.units_detokenized += len(tail)
        del self.ends[shared + 1:]
        for piece in tail:
            self.ends.append(self.ends[-1] + len(piece))
        self.unstripped = self.unstripped[:self.ends[shared]] + "".join(tail)
        self.units = units
        return self.unstripped.strip()
