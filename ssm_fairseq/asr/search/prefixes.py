"""The prefixes of a frame-synchronous transducer beam search and their merging, in plain Python (no torch): shared by
``beam_search`` (PyTorch) and the ONNX Runtime recognizer's port (``ssm_fairseq.deploy.search``)."""
from __future__ import annotations

import math
from typing import Hashable, NamedTuple, Sequence


class Prefix(NamedTuple):
    """A label sequence in the beam, with the alignments merged into it.

    The sequences are tuples (the ONNX Runtime port) or nodes of a tree of shared prefixes (``prefix_tree``:
    ``tokens`` a ``Labels``, the others ``Chain``s; ``beam_search``), which extend in O(1); ``tokens`` must hash and
    compare by its labels, and ``list()`` of each gives its items."""

    tokens: Hashable  # the labels: a tuple or a prefix_tree.Labels
    score: float  # log-probability of the alignments merged into this prefix
    path_score: float  # log-probability of the best of them, the one token_scores and frames describe
    token_scores: Sequence[float]
    frames: Sequence[int]
    row: int  # the predictor state of this prefix in the search's state bank
    lm_row: int = -1  # its language-model state in the fusion's bank (-1: no fusion)


def log_add(a: float, b: float) -> float:
    """log(exp(a) + exp(b)), exact where either is -inf."""
    high, low = max(a, b), min(a, b)
    return high + math.log1p(math.exp(low - high)) if low > -math.inf else high


def leave_frame(finished: dict[Hashable, Prefix], prefix: Prefix, step_score: float) -> None:
    """Record ``prefix`` leaving the frame with a last step of log-probability ``step_score`` (blank, or 0 at the
    limit), merging prefixes with equal labels: their scores add, the better path's details stay."""
    leaving = prefix._replace(score=prefix.score + step_score, path_score=prefix.path_score + step_score)
    known = finished.get(prefix.tokens)
    if known is not None:
        best = leaving if leaving.path_score > known.path_score else known
        leaving = best._replace(score=log_add(known.score, leaving.score))
    finished[prefix.tokens] = leaving


def kth_best(finished: dict[Hashable, Prefix], k: int) -> float:
    """Score of the k-th best prefix that has left the frame; -inf while there are fewer than k."""
    if len(finished) < k:
        return -math.inf
    return sorted((p.score for p in finished.values()), reverse=True)[k - 1]
