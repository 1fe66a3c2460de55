"""Word timestamps from a transducer alignment: the frames at which the search emitted a word's units, and the
blank frames around them.

A transducer emits each unit at the encoder frame where its search took it (``Hypothesis.frames``, the
``alignment`` of fairseq's hypothesis dicts), on the best alignment; at every other frame it emits blank.
``emitted_words`` groups SentencePiece units into words (a ``"▁"`` starts a new word, as ``fairseq-generate
--post-process sentencepiece`` joins them), each with the first and last frame of its units. Encoder frame ``j``
stands for the audio of its filterbank frames, ``[j * frame_seconds, (j + 1) * frame_seconds)`` (``frame_seconds``
= the sub-sampling stride x 10 ms, e.g. 40 ms; the 15 ms by which the last filterbank window reaches beyond its hop
is ignored).

The emission frames alone (``emission_times``, this package's word times before issue 50) make poor word
boundaries: a causal (streaming) model emits a word's first unit after its sound has begun and its last unit before
the sound has ended, and several words often come out at one frame. ``word_timestamps`` (``aligned_times``) also
gives each word the blank frames around its emission frames:

* a word starts up to ``LEAD_FRAMES`` (4: 160 ms) before its first emission frame, over the blank frames since the
  previous word's last emission frame (never before the frame after it; the first word: never before 0);
* it ends up to ``TAIL_FRAMES`` (2: 80 ms) after its last emission frame, over the blank frames that follow, and
  never after the next word's start (the last word: never after the audio's end);
* never inside its own emission frames: a word spans at least them, so words overlap only where two share a frame.

Both bounds were measured (``scripts/benchmarks/word_timestamps.py``) against the known word boundaries of the mini
corpus (its synthesiser reports them, ``scripts/mini_word_boundaries.py``) with the mini recipe's causal model on
dev-mini, over leads of 0 to 12 and tails of 0 to 8 frames: the emission frames alone put starts a median 107 ms
late and ends 68 ms early (median absolute errors 107 and 70 ms); 4 and 2 frames gave 46 and 46 ms (90th
percentiles 126 and 155 ms, against 270 and 220), and 41 and 45 ms on test-mini, 44 and 44 ms on test-large
(docs/asr.md). A weak bidirectional model (5 epochs) emits its words in bursts, and no bound on blank frames places
them. Timed in pieces, words equal the whole wherever the pieces are cut after at least ``LEAD_FRAMES +
TAIL_FRAMES`` blank frames (a stream's endpoint waits for 0.8 s of blanks), so a stream with endpoints times its
words as offline decoding does; ``not_before`` and ``duration`` keep a segment's words inside it.

The times are the model's alignment, not a forced alignment: they follow the sound as closely as the model's
emissions do. A bidirectional encoder sees the whole utterance at every frame, and a poorly trained one may emit a
word before its sound, even at frame 0.

Pure Python (no torch, no fairseq), so the offline and the streaming transcribers and the ONNX Runtime recognizer
share it.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

WORD_BOUNDARY = "\u2581"  # SentencePiece's "▁": the unit starts a new word
LEAD_FRAMES = 4  # blank frames a word's start may reach back over (measured: the module docstring)
TAIL_FRAMES = 2  # blank frames its end may reach forward over


class TimedWord(NamedTuple):
    """A word and its time span in seconds from the start of the audio (``0 <= start <= end``)."""

    word: str
    start: float
    end: float


class EmittedWord(NamedTuple):
    """A word and the encoder frames its search emitted its first and last units at (``first <= last``)."""

    word: str
    first: int
    last: int


def emitted_words(units: Sequence[str], frames: Sequence[int]) -> list[EmittedWord]:
    """A hypothesis's SentencePiece units and their emission frames -> its words with their first and last frames.

    Args:
        units: the unit strings, in emission order (e.g. ``["▁THE", "▁CA", "T"]``), without the symbols that
            ``Dictionary.string`` strips (``</s>``, ``<s>``): every character of every unit is text.
        frames: ``frames[i]`` is the encoder frame (0-based, non-decreasing) at which ``units[i]`` was emitted.

    Returns:
        ``EmittedWord(word, first, last)`` per word, in order. Words are the maximal runs of characters between
        ``"▁"`` of the joined units: ``[w.word for w in words] == "".join(units).replace("▁", " ").split()``, so
        joined by single spaces they are the ``--post-process sentencepiece`` text, exactly unless the units put
        two ``"▁"`` in a row (which leaves two spaces in that text). A word's units are those holding its
        characters plus the unit whose ``"▁"`` opened it (a lone ``"▁"`` unit starts the word that follows). A
        leading unit without ``"▁"`` starts the first word all the same. No units: ``[]``.

    Raises:
        ValueError: ``units`` and ``frames`` of different lengths, or a negative or decreasing frame.
    """
    if len(units) != len(frames):
        raise ValueError(f"{len(units)} units but {len(frames)} frames")
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
    return [EmittedWord("".join(chars), first, last) for chars, first, last in spans]


def _check_frame_seconds(frame_seconds: float) -> None:
    if not frame_seconds > 0:
        raise ValueError(f"frame_seconds must be positive, got {frame_seconds}")


def _clamp(t: float, duration: float | None, not_before: float = 0.0) -> float:
    t = max(not_before, t)
    return t if duration is None else min(t, duration)


def emission_times(words: Sequence[EmittedWord], frame_seconds: float,
                   duration: float | None = None) -> list[TimedWord]:
    """Each word timed by its emission frames alone: from the start of its first unit's frame to the end of its
    last unit's, ``[first * frame_seconds, (last + 1) * frame_seconds]``, clamped to ``[0, duration]`` (this
    package's word times before issue 50; ``word_timestamps`` extends them over the blank frames)."""
    _check_frame_seconds(frame_seconds)
    return [TimedWord(w.word, _clamp(w.first * frame_seconds, duration), _clamp((w.last + 1) * frame_seconds,
                                                                               duration)) for w in words]


def aligned_times(words: Sequence[EmittedWord], frame_seconds: float, duration: float | None = None,
                  lead_frames: int = LEAD_FRAMES, tail_frames: int = TAIL_FRAMES,
                  not_before: float = 0.0) -> list[TimedWord]:
    """Each word timed by its emission frames and the blank frames around them (the module docstring's rule).

    Frame ``j`` is ``[j, j + 1) * frame_seconds``. A word whose units were emitted at frames ``first..last``
    starts at ``max(first - lead_frames, b)``, where ``b`` is the frame after the previous word's last emission
    frame (0 for the first word), but never after ``first``; it ends at ``min(last + 1 + tail_frames, s)``, where
    ``s`` is where the next word starts (``duration`` for the last word), but never before ``last + 1``. Then
    clamped to ``[not_before, duration]`` (a stream's segment: its start and end). Words never overlap except
    where two share an emission frame, and every word spans at least its own emission frames (unless clamped).
    """
    _check_frame_seconds(frame_seconds)
    if lead_frames < 0 or tail_frames < 0:
        raise ValueError(f"lead_frames and tail_frames must be >= 0, got {lead_frames} and {tail_frames}")
    starts = [min(w.first, max(w.first - lead_frames, 0 if i == 0 else words[i - 1].last + 1))
              for i, w in enumerate(words)]
    timed = []
    for i, w in enumerate(words):
        end_frame = w.last + 1 + tail_frames
        if i + 1 < len(words):
            end_frame = min(end_frame, starts[i + 1])
        end = max(end_frame, w.last + 1) * frame_seconds
        timed.append(TimedWord(w.word, _clamp(starts[i] * frame_seconds, duration, not_before),
                               _clamp(end, duration, not_before)))
    return timed


def word_timestamps(units: Sequence[str], frames: Sequence[int], frame_seconds: float,
                    duration: float | None = None, not_before: float = 0.0) -> list[TimedWord]:
    """The words of a hypothesis's SentencePiece units with their start and end times in seconds.

    Args:
        units, frames: a hypothesis's units and the encoder frame each was emitted at (``emitted_words``).
        frame_seconds: seconds per encoder frame (sub-sampling stride x 0.01 for 10 ms filterbank frames).
        duration: the audio's length in seconds; when given, every time is clamped to ``[not_before, duration]``
            (the last encoder frame may reach past the audio's end) and the last word's blank frames end there.
        not_before: no time before this (seconds). A stream cut into segments times each segment's words on their
            own, ``not_before`` its start and ``duration`` its end, so that they stay inside it (a word's lead and
            tail would otherwise reach over the cut).

    Returns:
        ``TimedWord(word, start, end)`` per word of ``emitted_words(units, frames)``, in order, timed by
        ``aligned_times`` at this module's ``LEAD_FRAMES`` and ``TAIL_FRAMES``. No units: ``[]``.

    Raises:
        ValueError: ``units`` and ``frames`` of different lengths, a negative or decreasing frame, or
            ``frame_seconds`` not positive.
    """
    _check_frame_seconds(frame_seconds)
    return aligned_times(emitted_words(units, frames), frame_seconds, duration, not_before=not_before)
