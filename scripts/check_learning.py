#!/usr/bin/env python3
"""Learning guard: train the ``make demo`` model for a few epochs and compare its validation curve with a recorded
known-good one, so that a change that slows learning is caught before a release (``make check-learning``).

    python scripts/check_learning.py [--epochs 8] [--tolerance 0.15] [--work-dir exp/check_learning] [--record]

Runs stages 1-2 of ``recipes/librispeech/run.sh --conf recipes/librispeech/conf/mini.sh`` (seed 1) from an empty
checkpoint directory for ``--epochs`` epochs (the mini conf holds its peak learning rate to epoch 20, so these are
exactly the first epochs of ``make demo``), reads the dev-mini ``rnnt_loss`` after each epoch from fairseq-train's
log and compares it with ``recipes/librispeech/conf/mini_learning_curve.tsv``: every epoch must stay within
``(1 + tolerance) x recorded``. Training is deterministic on one machine (the same losses run after run); the
tolerance absorbs the rounding differences of other CPUs, thread counts and library builds, not slower learning:
seeds 1-5 of the mini conf span 1.30-1.74 at epoch 6 and 0.79-1.26 at epoch 8 (34% and 59% above the best).
Prints a table of epoch, recorded, measured and limit; exits 1 when an epoch is above its limit or an epoch's
loss is missing from the log. ``--record`` writes the measured curve as the new reference instead.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "recipes/librispeech/conf/mini_learning_curve.tsv"
VALID_LOSS = re.compile(r"\| epoch (\d+) \| valid on '[^']+' subset \|.*?\| rnnt_loss ([0-9.]+) \|")


def parse_curve(log: str) -> dict[int, float]:
    """Epoch -> validation rnnt_loss from a fairseq-train log (the last value an epoch printed)."""
    return {int(epoch): float(loss) for epoch, loss in VALID_LOSS.findall(log)}


def read_reference(path: Path) -> dict[int, float]:
    """``epoch<TAB>dev rnnt_loss`` rows after a header line."""
    curve = {}
    for number, line in enumerate(path.read_text().splitlines()[1:], start=2):
        fields = line.split("\t")
        if len(fields) != 2:
            raise SystemExit(f"{path}:{number}: expected 'epoch<TAB>loss', got {line!r}")
        curve[int(fields[0])] = float(fields[1])
    return curve


def train(work_dir: Path, epochs: int) -> str:
    """Stages 1-2 of the mini recipe from an empty checkpoint directory; returns the combined output."""
    shutil.rmtree(work_dir / "checkpoints", ignore_errors=True)
    env = dict(os.environ, WORK_DIR=str(work_dir), MAX_EPOCH=str(epochs), SEED="1")
    command = ["bash", str(REPO / "recipes/librispeech/run.sh"), "--conf", str(REPO / "recipes/librispeech/conf/mini.sh"),
               "--stage", "1", "--stop-stage", "2"]
    print(f"training {epochs} epochs: {' '.join(command)} (WORK_DIR={work_dir})", flush=True)
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    (work_dir / "train.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        sys.exit(f"training failed (exit {result.returncode}); log: {work_dir / 'train.log'}\n{result.stderr[-2000:]}")
    return result.stdout + result.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=8, help="epochs to train and compare (default 8)")
    parser.add_argument("--tolerance", type=float, default=0.15,
                        help="allowed relative excess of each epoch's dev rnnt_loss over the recorded one")
    parser.add_argument("--work-dir", type=Path, default=REPO / "exp/check_learning")
    parser.add_argument("--reference", type=Path, default=REFERENCE)
    parser.add_argument("--record", action="store_true", help="write the measured curve as the reference")
    args = parser.parse_args()
    if args.epochs < 1:
        parser.error(f"--epochs must be at least 1, got {args.epochs}")
    if args.tolerance < 0:
        parser.error(f"--tolerance must be non-negative, got {args.tolerance}")
    if not args.record and not args.reference.exists():
        parser.error(f"no reference curve {args.reference}: record one with --record")
    reference = {} if args.record else read_reference(args.reference)
    if not args.record and (missing := [e for e in range(1, args.epochs + 1) if e not in reference]):
        parser.error(f"{args.reference} has no loss for epoch(s) {missing}: lower --epochs or re-record")

    args.work_dir.mkdir(parents=True, exist_ok=True)
    measured = parse_curve(train(args.work_dir.resolve(), args.epochs))
    if missing := [e for e in range(1, args.epochs + 1) if e not in measured]:
        sys.exit(f"no validation rnnt_loss for epoch(s) {missing} in {args.work_dir / 'train.log'}")
    if args.record:
        args.reference.write_text("epoch\tdev_rnnt_loss\n" + "".join(
            f"{e}\t{measured[e]}\n" for e in range(1, args.epochs + 1)))
        print(f"recorded {args.epochs} epochs -> {args.reference}")
        return
    print(f"| epoch | recorded | measured | limit (+{args.tolerance:.0%}) | |\n|---|---|---|---|---|")
    failed = []
    for epoch in range(1, args.epochs + 1):
        limit = reference[epoch] * (1 + args.tolerance)
        ok = measured[epoch] <= limit
        failed += [] if ok else [epoch]
        print(f"| {epoch} | {reference[epoch]:.3f} | {measured[epoch]:.3f} | {limit:.3f} | {'ok' if ok else 'SLOWER'} |")
    if failed:
        sys.exit(f"learning is slower than the recorded curve at epoch(s) {failed} ({args.reference})")
    print(f"learning check passed: {args.epochs} epochs within {args.tolerance:.0%} of {args.reference.name}")


if __name__ == "__main__":
    main()
