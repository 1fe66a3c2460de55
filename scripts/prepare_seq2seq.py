#!/usr/bin/env python
"""Train one SentencePiece model on some text files and encode others with it, for ``fairseq-preprocess``.

    python scripts/prepare_seq2seq.py --train-text A.txt B.src ... --encode A.txt B.src C.tgt ... --out DIR
        [--vocab-size 8000]

writes ``DIR/spm.model`` and, for every ``--encode`` file ``X``, ``DIR/X`` (its base name) as space-separated
pieces, line by line (empty lines stay empty, so document boundaries survive). Used by ``recipes/seq2seq``.

Lines are split as fairseq splits them (``\n``, ``\r\n``, ``\r``; not U+2028, U+0085 or form feed), and files
that differ only in their last suffix (``PREFIX.src`` and ``PREFIX.tgt``, which ``fairseq-preprocess
--trainpref PREFIX`` pairs line by line) must have as many lines: a mismatch is refused here, naming both files.
"""
from __future__ import annotations

import argparse
import logging
import sys
from itertools import groupby
from pathlib import Path

from prepare_mlm import read_lines, sentencepiece_encoder, write_encoded

logger = logging.getLogger("prepare_seq2seq")


def check_parallel(texts: dict[Path, list[str]]) -> None:
    """``ValueError`` naming two files of one ``PREFIX.*`` group (parallel data) whose line counts differ."""
    def prefix(path: Path) -> Path:
        return path.with_suffix("")

    for _, group in groupby(sorted(texts, key=prefix), key=prefix):
        first, *others = group
        for other in others:
            if len(texts[other]) != len(texts[first]):
                raise ValueError(f"{first} has {len(texts[first])} lines but {other} has {len(texts[other])}: "
                                 f"fairseq pairs their lines as parallel data, so the counts must match")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train-text", type=Path, nargs="+", required=True, help="text to train SentencePiece on")
    parser.add_argument("--encode", type=Path, nargs="+", required=True, help="files to encode (base names unique)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocab-size", type=int, default=8000)
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    names = [path.name for path in args.encode]
    if len(set(names)) != len(names):
        parser.error(f"--encode files must have distinct base names, got {names}")
    try:
        texts = {path: read_lines(path) for path in {*args.train_text, *args.encode}}
        check_parallel({path: texts[path] for path in args.encode})
        args.out.mkdir(parents=True, exist_ok=True)
        corpus = args.out / "spm_train.txt"
        corpus.write_text("".join(line + "\n" for path in args.train_text for line in texts[path] if line),
                          encoding="utf-8")
        encode = sentencepiece_encoder(corpus, args.out, args.vocab_size)
    except (OSError, ValueError) as error:
        logger.error("%s", error)
        return 1
    for path in args.encode:
        write_encoded(texts[path], encode, args.out / path.name)
        logger.info("%s: %d lines -> %s", path, len(texts[path]), args.out / path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
