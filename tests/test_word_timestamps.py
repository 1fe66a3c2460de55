"""word_timestamps: SentencePiece units and their emission frames -> timed words (emission frames and the blank
frames around them)."""
from __future__ import annotations

import pytest

from ssm_fairseq.asr.search.word_timestamps import (LEAD_FRAMES, TAIL_FRAMES, EmittedWord, TimedWord, aligned_times,
                                                     emission_times, emitted_words, word_timestamps)

B = "\u2581"  # SentencePiece's word boundary


def _sentencepiece_text(units: list[str]) -> str:
    """What fairseq-generate --post-process sentencepiece makes of the units."""
    return " ".join(units).replace(" ", "").replace(B, " ").strip()


def _frames(words: list[TimedWord], frame_seconds: float = 0.04) -> list[tuple[str, int, int]]:
    """Times back in whole frames (the tests' times are multiples of a frame)."""
    return [(w.word, round(w.start / frame_seconds), round(w.end / frame_seconds)) for w in words]


# --- grouping units into words, each with its first and last emission frame ---

def test_units_group_into_words_with_their_first_and_last_emission_frames():
    units = [B + "THE", B + "CA", "T", B + "SAT"]
    words = emitted_words(units, [2, 5, 9, 12])
    assert words == [EmittedWord("THE", 2, 2), EmittedWord("CAT", 5, 9), EmittedWord("SAT", 12, 12)]
    assert " ".join(w.word for w in words) == _sentencepiece_text(units)


def test_a_lone_boundary_unit_opens_the_next_word_at_its_own_frame():
    units = [B + "A", B, "B", "C"]
    assert emitted_words(units, [0, 4, 6, 7]) == [EmittedWord("A", 0, 0), EmittedWord("BC", 4, 7)]
    assert " ".join(w.word for w in emitted_words(units, [0, 4, 6, 7])) == _sentencepiece_text(units)
    # a boundary with no word after it (the end) makes nothing
    assert emitted_words([B + "A", B], [0, 1]) == [EmittedWord("A", 0, 0)]


def test_a_leading_unit_without_boundary_starts_the_first_word():
    units = ["ING", "S", B + "GO"]
    assert emitted_words(units, [1, 2, 5]) == [EmittedWord("INGS", 1, 2), EmittedWord("GO", 5, 5)]


def test_no_units_no_words():
    assert emitted_words([], []) == [] and word_timestamps([], [], 0.04) == []
    assert word_timestamps([B, B], [0, 1], 0.04) == []


# --- the emission rule (before issue 50): a word spans its units' emission frames ---

def test_the_emission_rule_spans_the_first_to_the_last_emission_frame():
    words = emission_times(emitted_words([B + "THE", B + "CA", "T", B + "SAT"], [2, 5, 9, 12]), 0.04)
    assert words == [TimedWord("THE", 0.08, 0.12), TimedWord("CAT", 0.2, 0.4), TimedWord("SAT", 0.48, 0.52)]
    # the last frame (12) spans 0.48-0.52 s, past 0.5 s of audio
    assert emission_times([EmittedWord("A", 11, 11), EmittedWord("B", 12, 12)], 0.04, 0.5) == [
        TimedWord("A", 0.44, 0.48), TimedWord("B", 0.48, 0.5)]


# --- the aligned rule: the blank frames around the emission frames ---

def test_a_word_reaches_back_over_the_blanks_before_it_up_to_the_lead():
    # blanks 0-4 before A (lead 3: from frame 2), 6-7 between A and B (B from 6: only 2 blanks), 9-19 before C
    words = [EmittedWord("A", 5, 5), EmittedWord("B", 8, 8), EmittedWord("C", 20, 21)]
    timed = aligned_times(words, 0.04, lead_frames=3, tail_frames=0)
    assert _frames(timed) == [("A", 2, 6), ("B", 6, 9), ("C", 17, 22)]
    assert all(isinstance(w.start, float) and isinstance(w.end, float) for w in timed)


def test_a_word_ends_over_the_blanks_after_it_up_to_the_tail_or_the_next_word():
    words = [EmittedWord("A", 5, 5), EmittedWord("B", 8, 8), EmittedWord("C", 20, 21)]
    # tail 2: A would end at 8 but B starts at 6 (B's lead reaches back to A's last frame + 1)
    assert _frames(aligned_times(words, 0.04, lead_frames=3, tail_frames=2)) == [
        ("A", 2, 6), ("B", 6, 11), ("C", 17, 24)]
    # lead 0: B starts at its own frame, A ends at 8 (its 2 blanks), C's tail runs to the audio's end (0.9 s)
    assert _frames(aligned_times(words, 0.04, 0.9, lead_frames=0, tail_frames=9)) == [
        ("A", 5, 8), ("B", 8, 18), ("C", 20, 22)]
    assert aligned_times(words, 0.04, 0.9, lead_frames=0, tail_frames=9)[-1].end == 0.9


def test_words_sharing_a_frame_share_it_and_never_overlap_otherwise():
    words = [EmittedWord("A", 3, 3), EmittedWord("B", 3, 3), EmittedWord("C", 4, 6), EmittedWord("D", 6, 7)]
    timed = aligned_times(words, 0.04, lead_frames=4, tail_frames=4)
    assert _frames(timed) == [("A", 0, 4), ("B", 3, 4), ("C", 4, 7), ("D", 6, 12)]
    for word, emitted in zip(timed, words):  # every word spans at least its own emission frames
        assert word.start <= emitted.first * 0.04 + 1e-9 and word.end >= (emitted.last + 1) * 0.04 - 1e-9
    for a, b, ea, eb in zip(timed, timed[1:], words, words[1:]):
        assert a.end <= b.start + 1e-9 or ea.last == eb.first


def test_lead_and_tail_zero_is_the_emission_rule():
    words = emitted_words([B + "A", "B", B + "C", B + "D"], [1, 4, 4, 9])
    assert aligned_times(words, 0.06, 1.0, lead_frames=0, tail_frames=0) == emission_times(words, 0.06, 1.0)


def test_times_are_clamped_to_the_audio():
    words = [EmittedWord("A", 0, 0), EmittedWord("B", 12, 12)]
    timed = aligned_times(words, 0.04, 0.5, lead_frames=2, tail_frames=3)
    assert timed == [TimedWord("A", 0.0, pytest.approx(0.16)), TimedWord("B", pytest.approx(0.4), 0.5)]
    assert aligned_times([EmittedWord("A", 20, 20)], 0.04, 0.5, 2, 3) == [TimedWord("A", 0.5, 0.5)]


def test_word_timestamps_is_the_aligned_rule_at_the_measured_lead_and_tail():
    units, frames = [B + "THE", B + "CA", "T", B + "SAT", B + "ON"], [2, 5, 9, 12, 30]
    words = word_timestamps(units, frames, 0.04, 1.5)
    assert words == aligned_times(emitted_words(units, frames), 0.04, 1.5, LEAD_FRAMES, TAIL_FRAMES)
    assert " ".join(w.word for w in words) == _sentencepiece_text(units)
    assert LEAD_FRAMES > 0 or TAIL_FRAMES > 0  # not the emission rule


def test_words_timed_in_pieces_split_at_a_long_pause_equal_the_whole():
    """A stream with endpoints times each segment's words on their own (its next segment unknown yet): where
    segments are cut after at least LEAD_FRAMES + TAIL_FRAMES blank frames (the endpoint rule waits 0.8 s, 20
    frames), the pieces' words are the whole transcript's."""
    gap = LEAD_FRAMES + TAIL_FRAMES
    units = [B + "A", B + "B", "C", B + "D", B + "E"]
    frames = [1, 3, 4, 4 + 1 + gap, 9 + gap]

    def in_pieces(frames: list[int]) -> list[TimedWord]:
        return word_timestamps(units[:3], frames[:3], 0.04, 2.0) + word_timestamps(units[3:], frames[3:], 0.04, 2.0)

    assert in_pieces(frames) == word_timestamps(units, frames, 0.04, 2.0)
    # one blank frame fewer and the pieces differ (the test can fail)
    closer = frames[:3] + [f - 1 for f in frames[3:]]
    assert gap == 0 or in_pieces(closer) != word_timestamps(units, closer, 0.04, 2.0)


@pytest.mark.parametrize("units, frames, seconds, message", [
    ([B + "A"], [0, 1], 0.04, "1 units but 2 frames"),
    ([B + "A", "B"], [3, 2], 0.04, "non-decreasing"),
    ([B + "A"], [-1], 0.04, "non-negative"),
    ([B + "A"], [0], 0.0, "frame_seconds must be positive"),
])
def test_inconsistent_input_is_refused(units, frames, seconds, message):
    with pytest.raises(ValueError, match=message):
        word_timestamps(units, frames, seconds)


def test_negative_lead_or_tail_is_refused():
    with pytest.raises(ValueError, match="lead_frames and tail_frames must be >= 0"):
        aligned_times([EmittedWord("A", 0, 0)], 0.04, lead_frames=-1)
    with pytest.raises(ValueError, match="frame_seconds must be positive"):
        emission_times([EmittedWord("A", 0, 0)], -0.04)


def test_a_segments_words_stay_inside_it():
    # a stream segment from 0.4 s to 1.0 s: the first word's lead and the last word's tail stop at its bounds
    units, frames = [B + "A", B + "B"], [11, 24]
    inside = word_timestamps(units, frames, 0.04, duration=1.0, not_before=0.4)
    assert _frames(inside) == [("A", 10, 14), ("B", 20, 25)]
    assert _frames(word_timestamps(units, frames, 0.04, duration=2.0)) == [
        ("A", 11 - LEAD_FRAMES, 12 + TAIL_FRAMES), ("B", 24 - LEAD_FRAMES, 25 + TAIL_FRAMES)]
