#!/usr/bin/env python
"""The bigram of a transducer's training transcripts, in its units, for LODR (``--ilm-path``, ``--ilm-weight``).

Reads the speech data directory as the transducer's task does: the target dictionary ``config.yaml``'s
``vocab_filename`` names, its SentencePiece model, and the ``tgt_text`` column of each ``--manifests`` split (the
transcripts the transducer was trained on, lower-cased as ``ssm-prepare-lm-text`` encodes them); writes the add-k
bigram (``ssm_fairseq.asr.search.bigram_lm``) as a JSON file::

    python scripts/build_bigram.py --data exp/librispeech/data \\
        --manifests train-clean-100,train-clean-360,train-other-500 --out exp/librispeech/lm/bigram.json
    fairseq-generate ... --lm-path LM.pt --lm-weight 0.3 --ilm-path exp/librispeech/lm/bigram.json --ilm-weight 0.1

A piece that the dictionary lacks (a SentencePiece model and dictionary of different runs) stops the run, naming the
manifest, the row and the piece; so does a missing manifest or one without ``tgt_text``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterator

import yaml
from fairseq.data import Dictionary

from ssm_fairseq.asr.search.bigram_lm import BigramLM
from ssm_fairseq.cli.prepare_lm_text import manifest_sentences, sentencepiece_model


def target_dictionary(data: Path) -> Dictionary:
    """The transducer's target dictionary: ``DATA/config.yaml``'s ``vocab_filename``."""
    config = yaml.safe_load((data / "config.yaml").read_text(encoding="utf-8")) or {}
    name = config.get("vocab_filename")
    if not name or not (data / name).is_file():
        raise FileNotFoundError(f"{data / 'config.yaml'}: its vocab_filename ({name!r}) is no file in {data}")
    return Dictionary.load(str(data / name))


def unit_sequences(data: Path, splits: list[str], dictionary: Dictionary) -> Iterator[list[int]]:
    """Each transcript of the splits as the dictionary's unit indices (``ValueError`` at a piece it lacks)."""
    model = sentencepiece_model(data)
    unk = dictionary.unk()
    for split in splits:
        for row, sentence in enumerate(manifest_sentences(data, split), start=1):
            pieces = model.encode(sentence.strip().lower(), out_type=str)
            units = [dictionary.index(piece) for piece in pieces]
            if unk in units:
                piece = pieces[units.index(unk)]
                raise ValueError(f"{data / split}.tsv row {row}: the piece {piece!r} is not in the dictionary "
                                 f"(the SentencePiece model and the dictionary are of different runs?)")
            yield units


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the speech data directory")
    parser.add_argument("--manifests", required=True, help="comma-separated training splits (DATA/SPLIT.tsv)")
    parser.add_argument("--add-k", type=float, default=0.1, help="add-k smoothing constant, > 0 (default 0.1)")
    parser.add_argument("--out", type=Path, required=True, help="the bigram file to write (JSON)")
    args = parser.parse_args(argv)
    dictionary = target_dictionary(args.data)
    sequences = list(unit_sequences(args.data, [s for s in args.manifests.split(",") if s], dictionary))
    if not sequences:
        parser.error(f"no transcripts in {args.manifests}")
    bigram = BigramLM.from_sequences(sequences, dictionary.symbols, args.add_k, dictionary.eos())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    bigram.save(args.out)
    print(f"{args.out}: {len(bigram.counts)} distinct pairs from {len(sequences)} transcripts, "
          f"{sum(len(s) for s in sequences)} units, {len(bigram.outcomes)} outcomes, add-k {args.add_k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
