"""What recognition gives: transcripts with timed words, the ``--timestamps`` column, and the error naming every
file that cannot be transcribed."""
from __future__ import annotations

import json
from typing import NamedTuple, Sequence

from .search.word_timestamps import TimedWord


class TimedTranscript(NamedTuple):
    """One file's transcript and its words with their times: ``[w.word for w in words] == text.split()``, so
    ``" ".join(w.word for w in words) == text`` unless the search emitted two word boundaries in a row (a lone
    ``"▁"`` unit after a word-initial one), which leaves two spaces in ``text`` (as in fairseq-generate's ``D-``
    line)."""

    text: str
    words: list[TimedWord]


class InputError(ValueError):
    """Audio files that cannot be transcribed, one line each naming the file."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def timed_words_json(words: Sequence[TimedWord]) -> str:
    """``--timestamps``' third column: ``[[word, start, end], ...]`` in seconds rounded to 0.01, on one line."""
    return json.dumps([[w.word, round(w.start, 2), round(w.end, 2)] for w in words], ensure_ascii=False)
