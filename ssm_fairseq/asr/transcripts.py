"""What recognition gives: transcripts with timed words, their segments, the ``--timestamps`` column, and the error
naming every file that cannot be transcribed.

Pure Python (no torch): the command line's output writers (``segment_formats``) use it whatever model ran.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, NamedTuple, Sequence, Union

if TYPE_CHECKING:
    from .search.word_timestamps import TimedWord

# A word and its start and end in seconds: a ``TimedWord``, or the plain ``(word, start, end)`` tuple it equals.
TimedWordLike = Union["TimedWord", tuple[str, float, float]]


class TimedTranscript(NamedTuple):
    """One file's transcript and its words with their times: ``[w.word for w in words] == text.split()``, so
    ``" ".join(w.word for w in words) == text`` unless the search emitted two word boundaries in a row (a lone
    ``"▁"`` unit after a word-initial one), which leaves two spaces in ``text`` (as in fairseq-generate's ``D-``
    line)."""

    text: str
    words: list[TimedWord]


class Segment(NamedTuple):
    """A stretch ``[start, end]`` of a file or stream (seconds from its start) and its transcript: ``text`` and
    its ``words`` with their times, within the segment (none without timestamps). A file or stream is one segment,
    or the consecutive segments its endpoints cut (``ssm_fairseq.asr.endpoints``)."""

    start: float
    end: float
    text: str
    words: list[TimedWordLike]


def joined(segments: Sequence[Segment]) -> TimedTranscript:
    """Segments -> the ``TimedTranscript`` of them all: their texts joined by a space (empty ones left out), their
    words in order. One segment gives its own text and words."""
    return TimedTranscript(" ".join(s.text for s in segments if s.text), [w for s in segments for w in s.words])


class InputError(ValueError):
    """Audio files that cannot be transcribed, one line each naming the file."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def timed_words_json(words: Sequence[TimedWordLike]) -> str:
    """``--timestamps``' third column: ``[[word, start, end], ...]`` in seconds rounded to 0.01, on one line."""
    return json.dumps([[word, round(start, 2), round(end, 2)] for word, start, end in words], ensure_ascii=False)
