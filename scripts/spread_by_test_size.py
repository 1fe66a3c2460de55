"""How much of the spread of WER over seeds a test set of a given size shows by chance alone.

Reads the ``fairseq-generate`` output of several models on one test set (``scripts/seed_spread.sh`` leaves one per
seed: ``WORK/seed<N>/decode/<arch>/<SUBSET>/generate-<SUBSET>.txt``), counts each utterance's word errors, and for
each size N draws ``--draws`` random N-utterance subsets of the test set and scores every model on each. It prints,
per size, the median and 90th percentile over draws of worst / best WER among the models and how often that ratio
is at most ``--ratio``: the same models look that far apart on a test set of N utterances only because of which
utterances it holds. The subsets are drawn from the test set itself, so for sizes near the set's own they
understate how far an independent set of that size would move (by the factor ``sqrt(1 - N / size of the set)``).
The WER of every model on the whole set, recomputed here, must equal the one ``fairseq-generate`` printed (the run
fails otherwise).

    .venv/bin/python scripts/spread_by_test_size.py exp/seed_spread/mini --subset test-large --sizes 60 300 600
"""
from __future__ import annotations

import argparse
import math
import random
import re
import statistics
import sys
from pathlib import Path

import editdistance

TARGET = re.compile(r"^T-(\d+)\t(.*)$", re.M)
HYPOTHESIS = re.compile(r"^D-(\d+)\t\S+\t(.*)$", re.M)
WER_LINE = re.compile(r"^Generate .* WER: ([0-9.]+)$", re.M)


def utterance_errors(path: Path) -> dict[int, tuple[int, int]]:
    """``{sample id: (word errors, reference words)}`` from one ``generate-SUBSET.txt``; ``ValueError`` when a
    reference has no hypothesis or the recomputed WER differs from the file's."""
    text = path.read_text(encoding="utf-8")
    references, hypotheses = dict(TARGET.findall(text)), dict(HYPOTHESIS.findall(text))
    if not references or references.keys() != hypotheses.keys():
        raise ValueError(f"{path}: {len(references)} references and {len(hypotheses)} hypotheses (D- lines) do not "
                         f"pair up")
    errors = {int(i): (editdistance.eval(references[i].split(), hypotheses[i].split()), len(references[i].split()))
              for i in references}
    printed = WER_LINE.findall(text)
    if not printed:
        raise ValueError(f"{path}: no 'Generate ... WER:' line")
    recomputed = 100 * sum(e for e, _ in errors.values()) / sum(n for _, n in errors.values())
    if abs(recomputed - float(printed[-1])) > 0.01:
        raise ValueError(f"{path}: WER recomputed from its lines is {recomputed:.2f}, the file says {printed[-1]}")
    return errors


def wer(errors: dict[int, tuple[int, int]], ids: list[int]) -> float:
    """Corpus WER (%) of one model over the utterances ``ids``."""
    return 100 * sum(errors[i][0] for i in ids) / sum(errors[i][1] for i in ids)


def worst_over_best(wers: list[float]) -> float:
    """max / min of the models' WERs: 1 when all are 0, infinite when only the best is 0."""
    if min(wers) > 0:
        return max(wers) / min(wers)
    return 1.0 if max(wers) == 0 else math.inf


def spread_by_size(models: dict[str, dict[int, tuple[int, int]]], sizes: list[int], draws: int, ratio: float,
                   seed: int = 0) -> list[dict]:
    """Per size: ``{"size", "median", "p90", "share"}`` of worst / best WER over ``draws`` random subsets (the
    whole set once, when the size is the set's)."""
    ids = sorted(next(iter(models.values())))
    rng = random.Random(seed)
    rows = []
    for size in sizes:
        samples = [ids] if size == len(ids) else [rng.sample(ids, size) for _ in range(draws)]
        ratios = sorted(worst_over_best([wer(e, s) for e in models.values()]) for s in samples)
        rows.append({"size": size, "median": statistics.median(ratios),
                     "p90": ratios[min(len(ratios) - 1, int(0.9 * len(ratios)))],
                     "share": sum(r <= ratio for r in ratios) / len(ratios)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("work", type=Path, help="a scripts/seed_spread.sh work directory")
    parser.add_argument("--subset", default="test-large", help="the evaluation set (default test-large)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[60, 120, 300, 600], help="subset sizes")
    parser.add_argument("--draws", type=int, default=1000, help="random subsets per size")
    parser.add_argument("--ratio", type=float, default=1.5, help="the worst / best WER aimed for")
    args = parser.parse_args(argv)
    paths = sorted(args.work.glob(f"seed*/decode/*/{args.subset}/generate-{args.subset}.txt"))
    if len(paths) < 2:
        print(f"error: {len(paths)} decodings of {args.subset} under {args.work}/seed*/decode/*/ (need 2 or more)",
              file=sys.stderr)
        return 1
    try:
        models = {str(path.relative_to(args.work).parts[0]): utterance_errors(path) for path in paths}
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if len({frozenset(errors) for errors in models.values()}) != 1:
        print(f"error: the decodings of {args.subset} hold different utterances", file=sys.stderr)
        return 1
    total = len(next(iter(models.values())))
    too_big = [size for size in args.sizes if not 0 < size <= total]
    if too_big:
        print(f"error: --sizes {too_big}: {args.subset} has {total} utterances", file=sys.stderr)
        return 1
    print(" ".join(f"{name} {wer(errors, sorted(errors)):.2f}" for name, errors in models.items()),
          f"(WER % on all {total} utterances of {args.subset})")
    print(f"| utterances | worst / best, median | 90th percentile | share <= {args.ratio} |")
    print("|---|---|---|---|")
    for row in spread_by_size(models, args.sizes, args.draws, args.ratio):
        print(f"| {row['size']} | {row['median']:.2f} | {row['p90']:.2f} | {row['share']:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
