#!/usr/bin/env python
"""Generate the far-ordering task that ``recipes/seq2seq/run.sh`` fine-tunes on when no corpus is given.

Each source is ``--length`` filler words with two different marker words inserted (each ``--run`` times in a
row), the first at least ``--margin`` words from the start, the second at least ``--gap`` words after it and
``--margin`` words before the end; the target is the two markers in the order they occur. Which markers occur
can be read off by cross-attention from any encoder; their order cannot unless the encoder combines the two
far-apart positions. With attention windows whose reach (layers x window) is below ``--margin`` and below half of
``--gap``, no position's encoding depends on both markers (each marker's is the same wherever it stands), and a
local-only encoder can do no better than guessing the order (half of the examples exactly right). With a reach
between half of ``--gap`` and ``--gap``, the markers' encodings still do not see each other, but filler words
between them see both, and a local model can learn the order from those. SPADE's S4 layer sees the whole source.

    python scripts/make_order_task.py OUT_DIR [--train 2000 --length 600 --margin 150 --gap 150 --run 1 --seed 1]

writes ``OUT_DIR/{train,valid,test}.{src,tgt}`` (one example per line, words separated by spaces).
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

WORDS = ["amber", "birch", "cedar", "dune", "ember", "fjord", "grove", "heath", "inlet", "jade", "kelp", "loch",
         "marsh", "north", "onyx", "pine", "quartz", "reef", "slate", "tundra", "umber", "vale", "willow", "yarrow"]
MARKERS = ["red", "blue", "green", "white", "black", "gold"]


def example(rng: random.Random, length: int, margin: int, gap: int, run: int) -> tuple[str, str]:
    """One (source, target) pair: ``run`` copies of each marker inserted at filler positions ``first < second``."""
    words = [rng.choice(WORDS) for _ in range(length)]
    markers = rng.sample(MARKERS, 2)
    first = rng.randint(margin, length - margin - gap)
    second = rng.randint(first + gap, length - margin)
    words[second:second] = [markers[1]] * run
    words[first:first] = [markers[0]] * run
    return " ".join(words), " ".join(markers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--valid", type=int, default=100)
    parser.add_argument("--test", type=int, default=100)
    parser.add_argument("--length", type=int, default=600, help="filler words per source")
    parser.add_argument("--margin", type=int, default=150, help="filler words at least before the first marker and "
                                                                "after the second")
    parser.add_argument("--gap", type=int, default=150, help="filler words at least between the two markers")
    parser.add_argument("--run", type=int, default=1, help="each marker word this many times in a row (more to find "
                                                           "for a model trained briefly)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.run < 1:
        parser.error(f"--run must be at least 1, got {args.run}")
    if min(args.margin, args.gap) < 0 or 2 * args.margin + args.gap > args.length:
        parser.error(f"--length {args.length} has no room for --margin {args.margin} on both sides and --gap "
                     f"{args.gap} between the markers (needs 2 x margin + gap <= length)")
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        pairs = [example(rng, args.length, args.margin, args.gap, args.run) for _ in range(getattr(args, split))]
        for side, column in (("src", 0), ("tgt", 1)):
            (args.out / f"{split}.{side}").write_text("".join(p[column] + "\n" for p in pairs), encoding="utf-8")
    print(f"wrote {args.train}/{args.valid}/{args.test} ordering examples ({args.length} filler words, markers "
          f"{args.run} in a row, >= {args.margin} words from either end and >= {args.gap} apart) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
