"""Transcripts as files: ``ssm-transcribe --format text|json|tsv|srt|vtt`` writes each audio file's segments, and
reads them back (the tests parse what is written; a caller may too).

A file's transcript is a list of ``Segment(start, end, text, words)`` (``ssm_fairseq.asr.transcripts``): one per
file, covering it whole, unless endpoints cut it (``ssm_fairseq.asr.endpoints``). Times are seconds from the start
of the file; the formats keep milliseconds (``json``, ``srt``, ``vtt``) or hundredths (``tsv``, ``text``).

* ``text``: one line per file, ``PATH<TAB>transcript``, the segments' texts joined by a space; with words,
  a third column, the words with their times as a JSON list of ``[word, start, end]`` (ssm-transcribe's lines
  before segments existed, unchanged).
* ``tsv``: a header ``path<TAB>start<TAB>end<TAB>text`` (and ``<TAB>words``), then one row per segment.
* ``json``: one document: ``[{"path": ..., "segments": [{"start": s, "end": e, "text": ..., "words": [{"word":
  ..., "start": s, "end": e}, ...]}, ...]}, ...]`` (``"words"`` only with words).
* ``srt`` (SubRip) and ``vtt`` (WebVTT): one cue per segment with text (a cue without text is not allowed:
  a file with no word has no cue), numbered from 1, ``HH:MM:SS,mmm --> HH:MM:SS,mmm`` (``.mmm`` in WebVTT).
  Subtitles hold one audio file each, and carry no word times.

Pure Python (no torch): the command line writes these whatever model produced the transcript.
"""
from __future__ import annotations

import json
import re
from typing import Sequence

from .transcripts import Segment, joined, timed_words_json

FORMATS = ("text", "json", "tsv", "srt", "vtt")
SUBTITLE_FORMATS = ("srt", "vtt")
EXTENSIONS = {"text": "txt", "json": "json", "tsv": "tsv", "srt": "srt", "vtt": "vtt"}

FileSegments = tuple[str, Sequence[Segment]]  # (audio path, its segments)


class SubtitleFormatError(ValueError):
    """A subtitle file that is not well formed, naming the line."""


def _ms(seconds: float) -> float:
    return round(seconds, 3)


def format_text(files: Sequence[FileSegments], words: bool) -> str:
    """``PATH<TAB>transcript`` per file (``<TAB>`` the words as JSON with ``words``), each line ending in ``\\n``."""
    lines = []
    for path, segments in files:
        columns = [path, joined(segments).text]
        if words:
            columns.append(timed_words_json([word for segment in segments for word in segment.words]))
        lines.append("\t".join(columns) + "\n")
    return "".join(lines)


def format_tsv(files: Sequence[FileSegments], words: bool, header: bool = True) -> str:
    """A header (unless not ``header``), then ``path<TAB>start<TAB>end<TAB>text`` (``<TAB>words``) per segment,
    times to 0.01 s."""
    rows = ["\t".join(["path", "start", "end", "text"] + (["words"] if words else [])) + "\n"] if header else []
    for path, segments in files:
        for segment in segments:
            columns = [path, f"{segment.start:.2f}", f"{segment.end:.2f}", segment.text]
            rows.append("\t".join(columns + ([timed_words_json(segment.words)] if words else [])) + "\n")
    return "".join(rows)


def format_json(files: Sequence[FileSegments], words: bool) -> str:
    """One JSON document (see the module docstring), times to the millisecond, ending in ``\\n``."""
    def segment_dict(segment: Segment) -> dict:
        fields = {"start": _ms(segment.start), "end": _ms(segment.end), "text": segment.text}
        if words:
            fields["words"] = [{"word": w[0], "start": _ms(w[1]), "end": _ms(w[2])} for w in segment.words]
        return fields
    document = [{"path": path, "segments": [segment_dict(s) for s in segments]} for path, segments in files]
    return json.dumps(document, ensure_ascii=False, indent=1) + "\n"


def read_json(text: str) -> list[tuple[str, list[Segment]]]:
    """``format_json``'s document -> ``(path, segments)`` per file (words as ``(word, start, end)`` tuples, equal to
    ``TimedWord``s; none when the document has none)."""
    return [(entry["path"], [Segment(s["start"], s["end"], s["text"],
                                     [(w["word"], w["start"], w["end"]) for w in s.get("words", [])])
                             for s in entry["segments"]])
            for entry in json.loads(text)]


def _timestamp(seconds: float, separator: str) -> str:
    milliseconds = round(seconds * 1000)
    hours, rest = divmod(milliseconds, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    return f"{hours:02d}:{minutes:02d}:{rest // 1000:02d}{separator}{rest % 1000:03d}"


def format_subtitles(segments: Sequence[Segment], subtitle_format: str) -> str:
    """One audio file's segments as ``srt`` or ``vtt`` cues (segments without text have none)."""
    separator = "," if subtitle_format == "srt" else "."
    blocks = ["WEBVTT\n"] if subtitle_format == "vtt" else []
    cues = [segment for segment in segments if segment.text.strip()]
    for number, segment in enumerate(cues, start=1):
        timing = f"{_timestamp(segment.start, separator)} --> {_timestamp(segment.end, separator)}"
        blocks.append(f"{number}\n{timing}\n{segment.text}\n")
    return "\n".join(blocks)


_TIMING = {"srt": re.compile(r"^(\d{2,}):([0-5]\d):([0-5]\d),(\d{3}) --> (\d{2,}):([0-5]\d):([0-5]\d),(\d{3})$"),
           "vtt": re.compile(r"^(\d{2,}):([0-5]\d):([0-5]\d)\.(\d{3}) --> (\d{2,}):([0-5]\d):([0-5]\d)\.(\d{3})$")}


def read_subtitles(text: str, subtitle_format: str) -> list[Segment]:
    """Parse ``srt`` or ``vtt`` cues (as ``format_subtitles`` writes them: a number, a timing line, one or more
    text lines, a blank line; after ``WEBVTT`` for vtt) -> ``Segment(start, end, text, [])`` per cue.

    Raises ``SubtitleFormatError`` naming the line for anything else: a missing header, numbers not counting from
    1, a malformed timing, a cue that ends before it starts or starts before the previous one, a cue with no text.
    """
    lines = text.split("\n")
    position = 0
    if subtitle_format == "vtt":
        if lines[0] != "WEBVTT" or (len(lines) > 1 and lines[1] != ""):
            raise SubtitleFormatError("line 1: a WebVTT file starts with 'WEBVTT' and a blank line")
        position = 2
    cues: list[Segment] = []
    while position < len(lines):
        if lines[position] == "":
            position += 1
            continue
        number, timing = lines[position], lines[position + 1] if position + 1 < len(lines) else ""
        if number != str(len(cues) + 1):
            raise SubtitleFormatError(f"line {position + 1}: cue number {len(cues) + 1} expected, got {number!r}")
        match = _TIMING[subtitle_format].match(timing)
        if not match:
            raise SubtitleFormatError(f"line {position + 2}: not a {subtitle_format} timing line: {timing!r}")
        h1, m1, s1, ms1, h2, m2, s2, ms2 = map(int, match.groups())
        start, end = h1 * 3600 + m1 * 60 + s1 + ms1 / 1000, h2 * 3600 + m2 * 60 + s2 + ms2 / 1000
        if end < start or (cues and start < cues[-1].start):
            raise SubtitleFormatError(f"line {position + 2}: cue times out of order: {timing!r}")
        position += 2
        body = []
        while position < len(lines) and lines[position] != "":
            body.append(lines[position])
            position += 1
        if not body:
            raise SubtitleFormatError(f"line {position + 1}: cue {len(cues) + 1} has no text")
        cues.append(Segment(round(start, 3), round(end, 3), "\n".join(body), []))
    return cues


def format_files(files: Sequence[FileSegments], output_format: str, words: bool) -> str:
    """``files``' transcripts in ``output_format`` (``FORMATS``); ``srt`` and ``vtt`` take one file
    (``ValueError`` otherwise): write each file's subtitles to its own file."""
    if output_format in SUBTITLE_FORMATS:
        if len(files) != 1:
            raise ValueError(f"{output_format} subtitles hold one audio file; got {len(files)}")
        return format_subtitles(files[0][1], output_format)
    writers = {"text": format_text, "tsv": format_tsv, "json": format_json}
    if output_format not in writers:
        raise ValueError(f"format must be one of {FORMATS}, got {output_format!r}")
    return writers[output_format](files, words)
