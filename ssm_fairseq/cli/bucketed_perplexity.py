"""Perplexity over tokens split into buckets, its markdown rows, and ``--checkpoint NAME=PATH`` lists: what
``ssm-lm-distance-ppl`` and ``ssm-mlm-evidence-ppl`` share."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch


class BucketLoss:
    """Summed negative log-likelihood (nats) and token count over all tokens and per bucket.

    Args:
        buckets: the bucket names; ``add`` takes each token's bucket as an index into them.
    """

    def __init__(self, buckets: tuple[str, ...]):
        self.buckets = buckets
        self.nll = dict.fromkeys(("all", *buckets), 0.0)
        self.count = dict.fromkeys(("all", *buckets), 0)

    def add(self, nll: torch.Tensor, buckets: torch.Tensor) -> None:
        """``nll``: ``M`` tokens' negative log-likelihoods; ``buckets``: their ``M`` bucket indices."""
        self.nll["all"] += nll.sum().item()
        self.count["all"] += len(nll)
        for index, name in enumerate(self.buckets):
            chosen = buckets.eq(index)
            self.nll[name] += nll[chosen].sum().item()
            self.count[name] += int(chosen.sum())

    def perplexity(self, key: str) -> float | None:
        """``exp`` of the mean NLL of a bucket (or ``all``); None for an empty bucket."""
        return math.exp(self.nll[key] / self.count[key]) if self.count[key] else None


def spread(values: list[float]) -> str:
    """``mean`` of one value, ``mean (min-max)`` of several."""
    mean = sum(values) / len(values)
    return f"{mean:.2f}" if len(values) == 1 else f"{mean:.2f} ({min(values):.2f}-{max(values):.2f})"


def table_rows(rows: list[tuple[str, int | None, list[BucketLoss]]]) -> list[str]:
    """A markdown line per ``(name, parameters or None, losses of its checkpoints)``: the perplexity of all tokens
    and of each bucket, mean (min-max) over several checkpoints, ``-`` for an empty bucket."""
    lines = []
    for name, parameters, losses in rows:
        cells = []
        for key in ("all", *losses[0].buckets):
            values = [loss.perplexity(key) for loss in losses]
            cells.append("-" if None in values else spread(values))
        runs = f" ({len(losses)} runs)" if len(losses) > 1 else ""
        size = "-" if parameters is None else f"{parameters:,}"
        lines.append(f"| {name}{runs} | {size} | " + " | ".join(cells) + " |")
    return lines


def named_checkpoints(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, list[Path]]:
    """``--checkpoint NAME=PATH`` values, grouped by name in the order given (a malformed one is a usage error)."""
    named: dict[str, list[Path]] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            parser.error(f"--checkpoint takes NAME=PATH, got '{item}'")
        named.setdefault(name, []).append(Path(path))
    return named
