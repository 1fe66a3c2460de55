"""Text files as fairseq reads them, and SentencePiece training with one-line errors (used by the data scripts).

Plain Python and sentencepiece only: no torch, no fairseq.
"""
from __future__ import annotations

import re
from pathlib import Path

import sentencepiece as spm


def file_lines(path: Path) -> list[bytes]:
    """The lines of a file as fairseq reads them, without their line ends.

    fairseq opens text in Python's universal-newlines mode: ``\n``, ``\r\n`` and ``\r`` end a line and nothing
    else does (``str.splitlines`` also splits at U+2028, U+0085, form feed, ..., which would shift every later
    line against fairseq's view of the file).
    """
    lines = path.read_bytes().replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    return lines[:-1] if lines[-1] == b"" else lines


def utf8(path: Path, number: int, line: bytes) -> str:
    """Line ``number`` (from 1) of ``path`` decoded; ``ValueError`` naming the file and line if it is not UTF-8."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}:{number}: not UTF-8 text (byte {line[error.start]:#04x} at byte "
                         f"{error.start + 1} of the line)") from None


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 file as fairseq splits them (``file_lines``), whitespace-only lines made empty.

    An error names a missing or empty file, or the file and line of text that is not UTF-8.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    lines = [utf8(path, number, line).strip() for number, line in enumerate(file_lines(path), 1)]
    if not any(lines):
        raise ValueError(f"{path}: no text")
    return lines


def train_sentencepiece_model(**options) -> None:
    """``SentencePieceTrainer.train(**options)``; a ``vocab_size`` below what the text needs (one piece per
    distinct character plus the special pieces) raises a one-line ``ValueError`` naming --vocab-size and the
    minimum instead of SentencePiece's traceback."""
    try:
        spm.SentencePieceTrainer.train(**options)
    except RuntimeError as error:
        too_small = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", str(error))
        if too_small is None:
            raise
        raise ValueError(f"--vocab-size {too_small[1]} is too small for the training text: it needs at least "
                         f"{too_small[2]} pieces (one per distinct character, plus the special pieces); "
                         f"use --vocab-size {too_small[2]} or more") from None
