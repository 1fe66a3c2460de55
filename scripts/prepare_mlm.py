#!/usr/bin/env python
"""Tokenise a long-document corpus (and an optional labelled TSV) for ``fairseq-preprocess``.

Input: ``RAW/{train,valid,test}.txt`` with one paragraph per line and an empty line between documents (the
format of RoBERTa's pre-training data), and optionally ``LABELLED/{train,valid}.tsv`` with ``label<TAB>text``
rows. Output in ``OUT``: ``{train,valid,test}.bpe`` (empty lines kept, so fairseq's ``complete_doc`` break
mode sees the documents) and ``labelled/input0/{split}.bpe``, ``labelled/label/{split}.label``.

Tokeniser: a unigram SentencePiece model trained on ``train.txt`` (``OUT/spm.model``), or GPT-2's byte-level
BPE when ``--gpt2-encoder-json`` and ``--gpt2-vocab-bpe`` are given (tokens written as BPE ids, as RoBERTa does).

    python scripts/prepare_mlm.py --raw RAW --out OUT [--vocab-size 8000] [--labelled LABELLED]
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Callable

import sentencepiece as spm

from ssm_fairseq.text_files import file_lines, read_lines, train_sentencepiece_model, utf8

logger = logging.getLogger("prepare_mlm")
SPLITS = ("train", "valid", "test")
LABELLED_SPLITS = ("train", "valid")


def sentencepiece_encoder(train_text: Path, out: Path, vocab_size: int) -> Callable[[str], str]:
    """Train a unigram model of at most ``vocab_size`` pieces (fewer if the text has fewer) on ``train_text``
    (``out/spm.model``) and return text -> space-separated pieces. ``ValueError`` if ``vocab_size`` is too small."""
    train_sentencepiece_model(
        input=str(train_text), model_prefix=str(out / "spm"), vocab_size=vocab_size, model_type="unigram",
        character_coverage=1.0, bos_id=-1, eos_id=-1, unk_id=0, minloglevel=2, hard_vocab_limit=False,
    )
    model = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    return lambda text: " ".join(model.encode(text, out_type=str))


def gpt2_encoder(encoder_json: Path, vocab_bpe: Path) -> Callable[[str], str]:
    """GPT-2 byte-level BPE: text -> space-separated BPE ids (what fairseq's RoBERTa dictionary indexes)."""
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    bpe = get_encoder(str(encoder_json), str(vocab_bpe))
    return lambda text: " ".join(map(str, bpe.encode(text)))


def write_encoded(lines: list[str], encode: Callable[[str], str], path: Path) -> None:
    """Encode every line (empty lines stay empty) and write ``path`` atomically."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join((encode(line) if line else "") + "\n" for line in lines), encoding="utf-8")
    tmp.replace(path)


def read_labelled(path: Path) -> tuple[list[str], list[str]]:
    """``label<TAB>text`` rows -> (labels, texts); an error names the file and line of a malformed row."""
    labels, texts = [], []
    for number, raw in enumerate(file_lines(path), 1):
        line = utf8(path, number, raw)
        label, sep, text = line.partition("\t")
        if not sep or not label.strip() or not text.strip() or " " in label.strip():
            raise ValueError(f"{path}:{number}: expected 'label<TAB>text' with a one-word label, got {line[:80]!r}")
        labels.append(label.strip())
        texts.append(text.strip())
    if not labels:
        raise ValueError(f"{path}: no rows")
    return labels, texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--raw", type=Path, required=True, help="directory with train.txt, valid.txt, test.txt")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocab-size", type=int, default=8000, help="SentencePiece vocabulary")
    parser.add_argument("--gpt2-encoder-json", type=Path, help="GPT-2 BPE encoder.json (with --gpt2-vocab-bpe)")
    parser.add_argument("--gpt2-vocab-bpe", type=Path, help="GPT-2 BPE vocab.bpe")
    parser.add_argument("--labelled", type=Path, help="directory with train.tsv and valid.tsv (label<TAB>text)")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    if (args.gpt2_encoder_json is None) != (args.gpt2_vocab_bpe is None):
        parser.error("--gpt2-encoder-json and --gpt2-vocab-bpe go together")
    try:
        documents = {split: read_lines(args.raw / f"{split}.txt") for split in SPLITS}
        labelled = {split: read_labelled(args.labelled / f"{split}.tsv") for split in LABELLED_SPLITS} \
            if args.labelled else {}
        args.out.mkdir(parents=True, exist_ok=True)
        if args.gpt2_encoder_json:
            encode = gpt2_encoder(args.gpt2_encoder_json, args.gpt2_vocab_bpe)
            logger.info("tokeniser: GPT-2 BPE from %s", args.gpt2_encoder_json)
        else:
            encode = sentencepiece_encoder(args.raw / "train.txt", args.out, args.vocab_size)
            logger.info("tokeniser: SentencePiece unigram %d trained on %s", args.vocab_size,
                        args.raw / "train.txt")
    except (OSError, ValueError) as error:
        logger.error("%s", error)
        return 1
    for split, lines in documents.items():
        write_encoded(lines, encode, args.out / f"{split}.bpe")
        logger.info("%s: %d documents, %d paragraphs", split, sum(1 for i, line in enumerate(lines) if line and
                    (i == 0 or not lines[i - 1])), sum(1 for line in lines if line))
    for split, (labels, texts) in labelled.items():
        for folder in ("input0", "label"):
            (args.out / "labelled" / folder).mkdir(parents=True, exist_ok=True)
        write_encoded(texts, encode, args.out / "labelled" / "input0" / f"{split}.bpe")
        write_encoded(labels, str, args.out / "labelled" / "label" / f"{split}.label")
        logger.info("labelled %s: %d rows, %d labels", split, len(labels), len(set(labels)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
