#!/usr/bin/env python
"""Scores the test outputs that ``fairseq-generate --scoring sacrebleu`` wrote (its stdout), for recipes/seq2seq.

    python scripts/score_generations.py generate_NAME.txt

prints one line of four tab-separated cells: the number of test examples, the share (%) of hypotheses exactly equal
to their target, the share equal up to word order, and sacreBLEU (``- (targets under 4 words)`` when no target has
the 4 words that BLEU's 4-grams need: it would be 0 whatever the outputs). Exits naming the file when it holds no
target, a target without its hypothesis (or the reverse), or no BLEU line: nothing to score.
"""
from __future__ import annotations

import re
import sys


def score(path: str) -> str:
    """The four tab-separated cells of fairseq-generate's output in ``path``; exits when it has nothing to score."""
    text = open(path, encoding="utf-8").read()
    targets = dict(re.findall(r"^T-(\d+)\t(.*)$", text, flags=re.M))
    hypotheses = dict(re.findall(r"^D-(\d+)\t\S+\t(.*)$", text, flags=re.M))
    bleu = re.search(r"BLEU = ([0-9.]+)", text)
    if not targets or targets.keys() != hypotheses.keys() or not bleu:
        sys.exit(f"{path}: {len(targets)} targets, {len(hypotheses)} hypotheses, BLEU {'found' if bleu else 'missing'}: "
                 "nothing to score")
    right = sum(hypotheses[i].split() == t.split() for i, t in targets.items())
    any_order = sum(sorted(hypotheses[i].split()) == sorted(t.split()) for i, t in targets.items())
    shown = bleu.group(1) if any(len(t.split()) >= 4 for t in targets.values()) else "- (targets under 4 words)"
    return f"{len(targets)}\t{100 * right / len(targets):.1f}\t{100 * any_order / len(targets):.1f}\t{shown}"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} generate_NAME.txt")
    print(score(sys.argv[1]))
