"""Word timestamps from a transducer alignment: the encoder frames at which the search emitted a word's units.

A transducer emits each unit at the encoder frame where its search took it (``Hypothesis.frames``, the
``alignment`` of fairseq's hypothesis dicts), on the best alignment. ``word_timestamps`` groups SentencePiece units
into words (a ``"▁"`` starts a new word, as ``fairseq-generate --post-process sentencepiece`` joins them) and gives
each word the time span of its units' frames. Encoder frame ``j`` stands for the audio of its filterbank frames,
``[j * frame_seconds, (j + 1) * frame_seconds)`` (``frame_seconds`` = the sub-sampling stride x 10 ms, e.g. 40 ms;
the 15 ms by which the last filterbank window reaches beyond its hop is ignored).

What the times mean: ``start`` is the start of the frame at which the model emitted the word's first unit, and
``end`` the end of the frame at which it emitted the last one. They are the model's decision times, not
phonetic boundaries: a transducer emits a unit once it has seen enough of the sound, usually at or after the
sound's start, so a word's ``start`` may lag its onset and its ``end`` fall before its offset (a word whose units
all come out in one frame spans that one frame). A bidirectional encoder sees the whole utterance at every frame,
so its emission frames follow the audio less strictly than a causal (streaming) encoder's: a poorly trained one
may emit a word before its sound, even at frame 0. Use the times for navigation and rough segmentation, not as a
forced alignment.

Pure Python (no torch, no fairseq), so the offline and the streaming transcribers share it.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

WORD_BOUNDARY = "\u2581"  # SentencePiece's "▁": the unit starts a new word


class TimedWord(NamedTuple):
    """A word and its time span in seconds from the start of the audio (``0 <= start <= end``)."""

    word: str
    start: float
    end: float


def word_timestamps(units: Sequence[str], frames: Sequence[int], frame_seconds: float,
                    duration: float | None = None) -> list[TimedWord]:
    """The words of a hypothesis's SentencePiece units, each timed by the encoder frames its units were emitted at.

    Args:
        units: the unit strings, in emission order (e.g. ``["▁THE", "▁CA", "T"]``), without the symbols that
            ``Dictionary.string`` strips (``</s>``, ``<s>``): every character of every unit is text.
        frames: ``frames[i]`` is the encoder frame (0-based, non-decreasing) at which ``units[i]`` was emitted.
        frame_seconds: seconds per encoder frame (sub-sampling stride x 0.01 for 10 ms filterbank frames).
        duration: the audio's length in seconds; when given, every time is clamped to ``[0, duration]`` (the last
            encoder frame may reach past the audio's end, and a unit emitted there would end after it).

    Returns:
        ``TimedWord(word, start, end)`` per word, in order. Words are the maximal runs of characters between
        ``"▁"`` of the joined units: ``[w.word for w in words] == "".join(units).replace("▁", " ").split()``, so
        joined by single spaces they are the ``--post-process sentencepiece`` text, exactly unless the units put
        two ``"▁"`` in a row (which leaves two spaces in that text). A word's units are those holding its
        characters plus the unit whose ``"▁"`` opened it (a lone ``"▁"`` unit starts the word that follows). A
        leading unit without ``"▁"`` starts the first word all the same. ``start`` is the start of its first
        unit's frame, ``end`` the end of its last unit's frame: ``start = frames[first] * frame_seconds``,
        ``end = (frames[last] + 1) * frame_seconds``, then clamped. Words are ordered and never overlap except
        where two share an emission frame. No units: ``[]``.

    Raises:
        ValueError: ``units`` and ``frames`` of different lengths, a negative or decreasing frame, or
            ``frame_seconds`` not positive.
    """
    if len(units) != len(frames):
        raise ValueError(f"{len(units)} units but {len(frames)} frames")
    if not frame_seconds > 0:
        raise ValueError(f"frame_seconds must be positive, got {frame_seconds}")
    if any(f < 0 for f in frames) or any(b < a for a, b in zip(frames, frames[1:])):
        raise ValueError(f"frames must be non-negative and non-decreasing, got {list(frames)}")
    spans: list[list] = []  # [characters, first frame, last frame]
    opened_at: int | None = None  # frame of the "▁" that opens the next word
    in_word = False
    for unit, frame in zip(units, frames):
        for char in unit:
            if char == WORD_BOUNDARY:
                in_word = False
                opened_at = frame
            elif in_word:
                spans[-1][0].append(char)
                spans[-1][2] = frame
            else:
                spans.append([[char], frame if opened_at is None else opened_at, frame])
                in_word, opened_at = True, None

    def clamp(t: float) -> float:
        t = max(0.0, t)
        return t if duration is None else min(t, duration)

    return [TimedWord("".join(chars), clamp(first * frame_seconds), clamp((last + 1) * frame_seconds))
            for chars, first, last in spans]
