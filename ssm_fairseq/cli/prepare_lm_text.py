"""Text for a language model over a transducer's units: sentences -> the transducer's SentencePiece pieces.

A language model fused into transducer search (``fairseq-generate --lm-path``) must read the transducer's units,
so its text is encoded with the speech data directory's SentencePiece model (``config.yaml``'s
``bpe_tokenizer``), then binarised with that directory's ``dict.txt``::

    ssm-prepare-lm-text --data data --out lm --train-manifests train-clean-100 --valid-manifests dev-clean
    ssm-prepare-lm-text --data data --out lm --train-text librispeech-lm-norm.txt.gz --valid-manifests dev-clean
    fairseq-preprocess --only-source --srcdict data/dict.txt --trainpref lm/train.txt --validpref lm/valid.txt \
        --destdir lm/bin

Writes ``OUT/train.txt`` and ``OUT/valid.txt``, one sentence per line in pieces, in input order. Text files
(plain or ``.gz``, UTF-8) give one sentence per line; manifests (``DATA/SPLIT.tsv``) their ``tgt_text`` column.
Sentences are lower-cased, as ``ssm-prepare-librispeech`` lower-cases transcripts (librispeech-lm-norm is upper
case); an empty line stays an empty sentence, as fairseq-preprocess keeps it. A missing file, a manifest without
``tgt_text``, text that is not UTF-8 (named by file and line) or no sentence at all stops the run, and leaves
``train.txt`` and ``valid.txt`` as they were: every input file is checked before anything is written, and both
outputs are written to temporary files that replace them only once both are complete (``atomic_files.replacing``).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import itertools
import logging
import sys
from pathlib import Path
from typing import Iterable, Iterator

import sentencepiece as spm
import yaml

from ssm_fairseq.atomic_files import replacing
from ssm_fairseq.text_files import utf8

logger = logging.getLogger("prepare_lm_text")
PROGRESS_EVERY = 1_000_000  # sentences between progress lines


def text_file_sentences(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 text file (``.gz`` read compressed), without line ends, streamed.

    A missing file raises ``FileNotFoundError`` at once, before any line is read. Lines end where fairseq's end
    (``\\n``, ``\\r\\n``, ``\\r``; not U+2028 and the like: ``file_lines``); a line that is not UTF-8 raises
    ``ValueError`` naming the file and line when it is reached."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    return _text_lines(path)


def _text_lines(path: Path) -> Iterator[str]:
    """``text_file_sentences``' lines, read when iterated."""
    number = 0
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as raw_lines:
        for raw in raw_lines:
            raw = raw[:-1] if raw.endswith(b"\n") else raw
            raw = raw[:-1] if raw.endswith(b"\r") else raw
            for line in raw.split(b"\r"):
                number += 1
                yield utf8(path, number, line)


def manifest_sentences(data: Path, split: str) -> Iterator[str]:
    """The ``tgt_text`` column of ``DATA/SPLIT.tsv``, read as fairseq reads manifests; a missing manifest or one
    without ``tgt_text`` raises at once, before any row is read."""
    path = data / f"{split}.tsv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such manifest")
    rows = _manifest_rows(path)
    columns = next(rows)
    if "tgt_text" not in columns:
        raise ValueError(f"{path}: no tgt_text column (columns: {columns})")
    return (row["tgt_text"] for row in rows)


def _manifest_rows(path: Path) -> Iterator:
    """The manifest's column names (``[]`` for an empty file), then its rows as dicts."""
    with open(path, encoding="utf-8", newline="") as rows:
        reader = csv.DictReader(rows, delimiter="\t", quotechar=None, doublequote=False, lineterminator="\n",
                                quoting=csv.QUOTE_NONE)
        yield reader.fieldnames or []
        yield from reader


def sentencepiece_model(data: Path) -> spm.SentencePieceProcessor:
    """The SentencePiece model that ``DATA/config.yaml`` names."""
    config_path = data / "config.yaml"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: no such file (--data must be a prepared speech data directory)")
    config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    name = (config.get("bpe_tokenizer") or {}).get("sentencepiece_model")
    if not name:
        raise ValueError(f"{config_path}: names no bpe_tokenizer.sentencepiece_model")
    path = data / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the SentencePiece model {config_path} names, not found")
    return spm.SentencePieceProcessor(model_file=str(path))


def write_pieces(sentences: Iterable[str], model: spm.SentencePieceProcessor, path: Path, into: Path) -> int:
    """Encode ``sentences`` (lower-cased) into the file ``into``, one line of space-separated pieces each -> how
    many; ``path`` is the output that file will replace, which messages name."""
    count = 0
    with open(into, "w", encoding="utf-8") as out:
        for count, sentence in enumerate(sentences, 1):
            out.write(" ".join(model.encode(sentence.strip().lower(), out_type=str)) + "\n")
            if count % PROGRESS_EVERY == 0:
                logger.info(f"{path}: {count:,} sentences")
    if count == 0:
        raise ValueError(f"{path}: no sentence to write (empty input)")
    logger.info(f"{path}: {count:,} sentences")
    return count


def sentence_sources(data: Path, texts: list[str], manifests: str | None) -> Iterator[str]:
    """The sentences of the text files, then of the manifests' transcripts; every file is checked (present, with a
    ``tgt_text`` column) now, before anything is read or written."""
    sources = [text_file_sentences(Path(text)) for text in texts]
    sources += [manifest_sentences(data, split) for split in (manifests.split(",") if manifests else [])]
    return itertools.chain.from_iterable(sources)


def write_outputs(out: Path, sources: dict[str, Iterator[str]], model: spm.SentencePieceProcessor) -> None:
    """``OUT/ROLE.txt`` for each role's sentences, all or none: each is written to a temporary file, and the files
    replace the outputs only when every one is complete, so a failed run leaves the previous outputs unchanged."""
    with contextlib.ExitStack() as outputs:
        for role, sentences in sources.items():
            path = out / f"{role}.txt"
            write_pieces(sentences, model, path, into=outputs.enter_context(replacing(path)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ssm-prepare-lm-text", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the speech data directory (config.yaml, SentencePiece model)")
    parser.add_argument("--out", required=True, help="directory for train.txt and valid.txt")
    parser.add_argument("--train-text", nargs="*", default=[], metavar="FILE",
                        help="text files, one sentence per line (.gz read compressed)")
    parser.add_argument("--train-manifests", default=None, metavar="SPLITS",
                        help="comma-separated manifests of --data whose transcripts are training text")
    parser.add_argument("--valid-text", nargs="*", default=[], metavar="FILE", help="validation text files")
    parser.add_argument("--valid-manifests", default=None, metavar="SPLITS",
                        help="comma-separated manifests of --data whose transcripts are validation text")
    args = parser.parse_args(argv)
    roles = ("train", "valid")
    for role in roles:
        if not getattr(args, f"{role}_text") and not getattr(args, f"{role}_manifests"):
            parser.error(f"give --{role}-text or --{role}-manifests")
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    data, out = Path(args.data), Path(args.out)
    try:
        model = sentencepiece_model(data)
        sources = {role: sentence_sources(data, getattr(args, f"{role}_text"), getattr(args, f"{role}_manifests"))
                   for role in roles}
        out.mkdir(parents=True, exist_ok=True)
        write_outputs(out, sources, model)
    except (FileNotFoundError, ValueError) as error:
        logger.error(str(error))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
