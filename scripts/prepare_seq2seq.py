#!/usr/bin/env python
"""Train one SentencePiece model on some text files and encode others with it, for ``fairseq-preprocess``.

    python scripts/prepare_seq2seq.py --train-text A.txt B.src ... --encode A.txt B.src C.tgt ... --out DIR
        [--vocab-size 8000]

writes ``DIR/spm.model`` and, for every ``--encode`` file ``X``, ``DIR/X`` (its base name) as space-separated
pieces, line by line (empty lines stay empty, so document boundaries survive). Used by ``recipes/seq2seq``.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from prepare_mlm import read_lines, sentencepiece_encoder, write_encoded

logger = logging.getLogger("prepare_seq2seq")


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
    except (OSError, ValueError) as error:
        logger.error("%s", error)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = args.out / "spm_train.txt"
    corpus.write_text("".join(line + "\n" for path in args.train_text for line in texts[path] if line),
                      encoding="utf-8")
    encode = sentencepiece_encoder(corpus, args.out, args.vocab_size)
    for path in args.encode:
        write_encoded(texts[path], encode, args.out / path.name)
        logger.info("%s: %d lines -> %s", path, len(texts[path]), args.out / path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
