"""Endpoint rules and the segment output formats (``asr.endpoints``, ``asr.segment_formats``): pure Python, no model.

The command line's outputs from real transcripts are tested in ``test_endpoints.py``; here, the rules' decisions,
the offline cut of timed words, and every format written and read back; and the command line's module importing
neither torch nor fairseq.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ssm_fairseq.asr.endpoints import EndpointRules, split_words
from ssm_fairseq.asr.search.word_timestamps import word_timestamps
from ssm_fairseq.asr.segment_formats import (SubtitleFormatError, format_files, format_json, format_subtitles,
                                             format_text, format_tsv, read_json, read_subtitles)
from ssm_fairseq.asr.transcripts import Segment, joined

from cli import REPO

RULES = EndpointRules(silence_without_speech=2.4, silence_after_speech=0.8, max_segment=5.0)


@pytest.mark.parametrize("segment, trailing, speech, rule", [
    (2.0, 2.0, False, None),   # a silence not yet long enough
    (2.4, 2.4, False, 1),      # rule 1: 2.4 s without a word
    (3.0, 0.79, True, None),   # a pause inside speech
    (3.0, 0.8, True, 2),       # rule 2: 0.8 s after the last word
    (5.0, 0.1, True, 3),       # rule 3: the longest segment
    (5.0, 2.4, False, 1),      # a pause ends a long segment by its own rule
    (1.0, 2.0, True, 2),
])
def test_each_rule_fires_at_its_threshold(segment, trailing, speech, rule):
    assert RULES.rule(segment, trailing, speech) == rule


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), True, "1"])
def test_rules_out_of_range_are_refused_naming_the_rule(value):
    with pytest.raises(ValueError, match="endpoint rule silence_after_speech must be a positive number of seconds"):
        EndpointRules(silence_after_speech=value)


WORDS = [("A", 0.2, 0.4), ("B", 0.5, 0.8), ("C", 2.0, 2.3), ("D", 2.4, 3.0), ("E", 3.1, 7.6), ("F", 7.8, 8.2)]


def test_offline_words_are_cut_at_pauses_and_at_the_longest_segment():
    segments = split_words(WORDS, 9.0, RULES, frame_seconds=0.04)
    assert [s.text for s in segments] == ["A B", "C D", "E", "F"]
    # the pause after B: the segment ends 0.8 s after B's last emission frame, which its time's tail of 2 blank
    # frames (80 ms) follows; E would end the segment that started at 1.52 s at 7.6 s (more than 5 s): it starts
    # the next one, at its own start. The 0.1 and 0.2 s gaps are 0.34 and 0.44 s of blank frames: no cut
    assert [t for s in segments for t in (s.start, s.end)] == pytest.approx([0, 1.52, 1.52, 3.1, 3.1, 7.8, 7.8, 9.0])
    assert [w for s in segments for w in s.words] == WORDS
    assert joined(segments).text == "A B C D E F"
    assert split_words([], 3.0, RULES, frame_seconds=0.04) == [Segment(0.0, 3.0, "", [])]
    assert split_words(WORDS[:2], 1.0, RULES, "A  B", frame_seconds=0.04) == [Segment(0.0, 1.0, "A  B", WORDS[:2])]
    with pytest.raises(ValueError, match="frame_seconds must be a positive number"):
        split_words(WORDS, 9.0, RULES, frame_seconds=0)


def _stream_cuts(emissions: list[tuple[int, int]], frames: int, rules: EndpointRules, seconds: float) -> list[float]:
    """Where a stream stepped one encoder frame at a time cuts (``Stream.search_frames``' rule 2 check), its
    search emitting each word's units at the given ``(first, last)`` frames: after frame ``n`` the best hypothesis
    has emitted every unit before ``n``, and the segment ends at ``n`` when ``rules.rule`` says so."""
    cuts, segment_start = [], 0
    for n in range(1, frames + 1):
        emitted = [last for first, last in emissions if segment_start <= first < n]
        trailing = n - segment_start if not emitted else n - (max(emitted) + 1)
        if rules.rule((n - segment_start) * seconds, trailing * seconds, bool(emitted)) == 2:
            cuts.append(n * seconds)
            segment_start = n
    return cuts


@pytest.mark.parametrize("frame_seconds", [0.04, 0.08])
def test_offline_cuts_at_pauses_where_a_stream_does_whatever_the_frame_duration(frame_seconds):
    """Words timed by ``word_timestamps`` (their starts reach back over blank frames, their ends forward) and cut by
    ``split_words``: the cuts are those of a stream's rule 2 counting blank frames after the last emission frame,
    for pauses just under, at and over 0.8 s (at 40 ms a frame the offline cut used to need 1.04 s of blanks)."""
    rules = EndpointRules(silence_after_speech=0.8, max_segment=1000.0)
    threshold = round(0.8 / frame_seconds)  # blank frames that end a segment
    gaps = [threshold - 1, threshold, threshold + 1, 3, threshold + 6, 0, threshold * 2, threshold - 4]
    emissions, frame = [], 2
    for n, gap in enumerate(gaps + [0]):
        emissions.append((frame, frame + n % 3))  # a word's units over 1 to 3 frames
        frame = emissions[-1][1] + 1 + gap
    frames = emissions[-1][1] + 1 + threshold // 2
    units = [unit for n, (first, last) in enumerate(emissions) for unit in [f"\u2581W{n}", *["X"] * (last - first)]]
    unit_frames = [f for first, last in emissions for f in range(first, last + 1)]
    words = word_timestamps(units, unit_frames, frame_seconds, frames * frame_seconds)
    segments = split_words(words, frames * frame_seconds, rules, frame_seconds=frame_seconds)
    expected = _stream_cuts(emissions, frames, rules, frame_seconds)
    assert len(expected) == sum(gap >= threshold for gap in gaps) == 4
    assert [s.start for s in segments[1:]] == pytest.approx(expected)
    assert all(s.start <= w.start <= w.end for s in segments for w in s.words)  # words inside their segment
    assert [w.word for s in segments for w in s.words] == [w.word for w in words]
    assert [w.end for s in segments for w in s.words] == [w.end for w in words]


SEGMENTS = [Segment(0.0, 1.6, "HELLO THERE", [("HELLO", 0.2, 0.4), ("THERE", 0.52, 0.8)]),
            Segment(1.6, 3661.25, "ÇA VA", [("ÇA", 2.0, 2.3), ("VA", 2.4, 3.0)]),
            Segment(3661.25, 3662.0, "", [])]
FILES = [("a.flac", SEGMENTS), ("dir/b c.wav", [Segment(0.0, 0.5, "", [])])]


def test_json_reads_back_what_it_wrote():
    assert read_json(format_json(FILES, words=True)) == FILES
    without_words = read_json(format_json(FILES, words=False))
    assert without_words == [(path, [s._replace(words=[]) for s in segments]) for path, segments in FILES]
    assert "words" not in json.loads(format_json(FILES, words=False))[0]["segments"][0]


def test_times_are_written_to_the_millisecond():
    document = json.loads(format_json([("a", [Segment(0.1 + 0.2, 0.04 * 3, "X", [("X", 1 / 3, 0.5)])])], True))
    assert document[0]["segments"][0] == {"start": 0.3, "end": 0.12, "text": "X",
                                          "words": [{"word": "X", "start": 0.333, "end": 0.5}]}


@pytest.mark.parametrize("subtitle_format", ["srt", "vtt"])
def test_subtitles_are_well_formed_and_read_back(subtitle_format):
    text = format_subtitles(SEGMENTS, subtitle_format)
    separator = "," if subtitle_format == "srt" else "."
    assert f"01:01:01{separator}250" in text and text.endswith("\n")
    cues = read_subtitles(text, subtitle_format)
    assert cues == [s._replace(words=[]) for s in SEGMENTS if s.text]  # a segment without text has no cue
    assert read_subtitles(format_subtitles([], subtitle_format), subtitle_format) == []


@pytest.mark.parametrize("broken, message", [
    ("1\n00:00:00,000 --> 00:00:01,000\nA\n\n3\n00:00:01,000 --> 00:00:02,000\nB\n", "cue number 2 expected"),
    ("1\n00:00:00.000 --> 00:00:01,000\nA\n", "not a srt timing line"),
    ("1\n00:00:02,000 --> 00:00:01,000\nA\n", "cue times out of order"),
    ("1\n00:00:00,000 --> 00:00:01,000\n\n", "cue 1 has no text"),
])
def test_malformed_subtitles_are_named_by_line(broken, message):
    with pytest.raises(SubtitleFormatError, match=message):
        read_subtitles(broken, "srt")
    with pytest.raises(SubtitleFormatError, match="line 1: a WebVTT file starts with 'WEBVTT'"):
        read_subtitles("1\n00:00:00.000 --> 00:00:01.000\nA\n", "vtt")


def test_text_lines_are_the_transcript_and_tsv_a_row_per_segment():
    assert format_text(FILES, words=False) == "a.flac\tHELLO THERE ÇA VA\ndir/b c.wav\t\n"
    assert format_text(FILES[:1], words=True).split("\t")[2] == \
        '[["HELLO", 0.2, 0.4], ["THERE", 0.52, 0.8], ["ÇA", 2.0, 2.3], ["VA", 2.4, 3.0]]\n'
    rows = [row.split("\t") for row in format_tsv(FILES, words=False).splitlines()]
    assert rows[0] == ["path", "start", "end", "text"]
    assert rows[1:] == [["a.flac", "0.00", "1.60", "HELLO THERE"], ["a.flac", "1.60", "3661.25", "ÇA VA"],
                        ["a.flac", "3661.25", "3662.00", ""], ["dir/b c.wav", "0.00", "0.50", ""]]
    assert format_tsv(FILES, words=True).splitlines()[1].split("\t")[4] == '[["HELLO", 0.2, 0.4], ["THERE", 0.52, 0.8]]'
    assert format_tsv(FILES, words=False, header=False) == format_tsv(FILES, words=False).split("\n", 1)[1]
    with pytest.raises(ValueError, match="srt subtitles hold one audio file; got 2"):
        format_files(FILES, "srt", words=False)


BLOCK_TORCH = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "fairseq", "torchaudio", "soundfile"):
            raise ImportError(f"{name} imported by the command line's module")
sys.meta_path.insert(0, Refuse())
import ssm_fairseq.cli.transcribe as cli
from ssm_fairseq.asr.segment_formats import read_json
from ssm_fairseq.asr.transcripts import Segment
args = cli.parse_args(["a.flac", "--checkpoint", "c.pt", "--endpoints", "--format", "json", "--timestamps",
                       "--max-segment", "30"])
output = cli.Output(args)
output.add("a.flac", [Segment(0.0, 1.0, "HI", [("HI", 0.2, 0.5)])])
output.close()
print(args.endpoint_rules.max_segment)
"""


def test_the_command_line_parses_and_writes_without_torch_or_fairseq():
    """The ONNX path of ``ssm-transcribe`` runs without torch: its module, argument checks and writers import none
    of torch, fairseq, torchaudio or soundfile (a finder that refuses them is installed first)."""
    result = subprocess.run([sys.executable, "-c", BLOCK_TORCH], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    document, max_segment = result.stdout.rsplit("\n", 2)[:2]
    assert read_json(document) == [("a.flac", [Segment(0.0, 1.0, "HI", [("HI", 0.2, 0.5)])])]
    assert max_segment == "30.0"
