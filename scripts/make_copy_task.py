#!/usr/bin/env python
"""Generate the long-range copy task that ``recipes/seq2seq/run.sh`` fine-tunes on when no corpus is given.

Each source is a key of ``--key-words`` words, then ``--distance`` filler words, then ``recall``; its target
is the key. The answer depends only on words ``--distance`` positions before the end of the source, far
outside a window attention of 64 or 128, which is what SPADE's S4 layer is meant to carry.

    python scripts/make_copy_task.py OUT_DIR [--train 2000 --valid 50 --test 50 --distance 1000 --seed 1]

writes ``OUT_DIR/{train,valid,test}.{src,tgt}`` (one example per line, words separated by spaces).
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

WORDS = ["amber", "birch", "cedar", "dune", "ember", "fjord", "grove", "heath", "inlet", "jade", "kelp", "loch",
         "marsh", "north", "onyx", "pine", "quartz", "reef", "slate", "tundra", "umber", "vale", "willow", "yarrow"]


def example(rng: random.Random, key_words: int, distance: int) -> tuple[str, str]:
    key = [rng.choice(WORDS) for _ in range(key_words)]
    filler = [rng.choice(WORDS) for _ in range(distance)]
    return " ".join(key + filler + ["recall"]), " ".join(key)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--valid", type=int, default=50)
    parser.add_argument("--test", type=int, default=50)
    parser.add_argument("--key-words", type=int, default=4)
    parser.add_argument("--distance", type=int, default=1000, help="filler words between the key and the end")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        pairs = [example(rng, args.key_words, args.distance) for _ in range(getattr(args, split))]
        for side, column in (("src", 0), ("tgt", 1)):
            (args.out / f"{split}.{side}").write_text("".join(p[column] + "\n" for p in pairs), encoding="utf-8")
    print(f"wrote {args.train}/{args.valid}/{args.test} copy examples (key {args.key_words} words, "
          f"distance {args.distance}) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
