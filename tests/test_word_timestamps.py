"""word_timestamps: SentencePiece units and their emission frames -> timed words."""
from __future__ import annotations

import pytest

from ssm_fairseq.asr.search.word_timestamps import TimedWord, word_timestamps

B = "\u2581"  # SentencePiece's word boundary


def _sentencepiece_text(units: list[str]) -> str:
    """What fairseq-generate --post-process sentencepiece makes of the units."""
    return " ".join(units).replace(" ", "").replace(B, " ").strip()


def test_units_group_into_words_timed_by_their_first_and_last_frames():
    units = [B + "THE", B + "CA", "T", B + "SAT"]
    words = word_timestamps(units, [2, 5, 9, 12], 0.04)
    assert words == [TimedWord("THE", 0.08, 0.12), TimedWord("CAT", 0.2, 0.4), TimedWord("SAT", 0.48, 0.52)]
    assert " ".join(w.word for w in words) == _sentencepiece_text(units)
    assert all(isinstance(w.start, float) and isinstance(w.end, float) for w in words)


def test_units_of_one_frame_and_words_sharing_a_frame():
    words = word_timestamps([B + "A", "B", B + "C"], [3, 3, 3], 0.06)
    assert [w.word for w in words] == ["AB", "C"]
    assert [(w.start, w.end) for w in words] == [pytest.approx((0.18, 0.24))] * 2


def test_a_lone_boundary_unit_opens_the_next_word_at_its_own_frame():
    units = [B + "A", B, "B", "C"]
    words = word_timestamps(units, [0, 4, 6, 7], 0.04)
    assert words == [TimedWord("A", 0.0, 0.04), TimedWord("BC", 0.16, 0.32)]
    assert " ".join(w.word for w in words) == _sentencepiece_text(units)
    # a boundary with no word after it (the end) makes nothing
    assert word_timestamps([B + "A", B], [0, 1], 0.04) == [TimedWord("A", 0.0, 0.04)]


def test_a_leading_unit_without_boundary_starts_the_first_word():
    units = ["ING", "S", B + "GO"]
    words = word_timestamps(units, [1, 2, 5], 0.04)
    assert words == [TimedWord("INGS", 0.04, 0.12), TimedWord("GO", 0.2, 0.24)]
    assert " ".join(w.word for w in words) == _sentencepiece_text(units)


def test_times_are_clamped_to_the_audio():
    # the last encoder frame (12) spans 0.48-0.52 s, past the 0.5 s of audio
    words = word_timestamps([B + "A", B + "B"], [11, 12], 0.04, duration=0.5)
    assert words == [TimedWord("A", 0.44, 0.48), TimedWord("B", 0.48, 0.5)]
    assert word_timestamps([B + "A"], [20], 0.04, duration=0.5) == [TimedWord("A", 0.5, 0.5)]
    assert word_timestamps([B + "A"], [20], 0.04) == [TimedWord("A", 0.8, pytest.approx(0.84))]


def test_no_units_no_words():
    assert word_timestamps([], [], 0.04) == []
    assert word_timestamps([B, B], [0, 1], 0.04) == []


@pytest.mark.parametrize("units, frames, seconds, message", [
    ([B + "A"], [0, 1], 0.04, "1 units but 2 frames"),
    ([B + "A", "B"], [3, 2], 0.04, "non-decreasing"),
    ([B + "A"], [-1], 0.04, "non-negative"),
    ([B + "A"], [0], 0.0, "frame_seconds must be positive"),
])
def test_inconsistent_input_is_refused(units, frames, seconds, message):
    with pytest.raises(ValueError, match=message):
        word_timestamps(units, frames, seconds)
