"""``ssm-mlm-evidence-ppl``: which masked tokens have their word visible within the window's reach."""
from __future__ import annotations

import math

import torch

from ssm_fairseq.cli import mlm_evidence_perplexity as evidence

PAD, MASK = 1, 9


def test_a_masked_word_is_inside_outside_or_nowhere_by_its_nearest_visible_copy():
    #                 0  1  2     3  4  5  6  7  8  9
    src = torch.tensor([[5, 6, MASK, 7, 8, 6, 4, 4, MASK, 5]])
    target = torch.full_like(src, PAD)
    target[0, 2] = 6  # word 6 visible 1 and 3 tokens away: inside a reach of 2
    target[0, 8] = 5  # word 5 visible 1 token away (position 9) and 8 away (position 0)
    buckets = evidence.evidence_buckets(src, target, PAD, reach=2).tolist()
    assert buckets == [0, 0]
    target[0, 8] = 7  # word 7 visible only at position 3: 5 tokens away, beyond a reach of 2
    assert evidence.evidence_buckets(src, target, PAD, reach=2).tolist() == [0, 1]
    assert evidence.evidence_buckets(src, target, PAD, reach=5).tolist() == [0, 0]
    target[0, 2] = 3  # word 3 appears nowhere in the input
    assert evidence.evidence_buckets(src, target, PAD, reach=2).tolist() == [2, 1]


def test_a_masked_position_showing_its_own_word_is_no_evidence_and_rows_are_separate():
    src = torch.tensor([[4, 5, 6, 7], [6, 5, 4, 4]])  # 10% of masked positions keep their word: not evidence
    target = torch.full_like(src, PAD)
    target[0, 2] = 6  # shown at itself only; the 6 of the other row does not count
    target[1, 2] = 4  # shown at itself and next door
    assert evidence.evidence_buckets(src, target, PAD, reach=1).tolist() == [2, 0]


def test_bucket_perplexities_add_up():
    loss = evidence.BucketLoss(evidence.BUCKETS)
    loss.add(torch.tensor([1.0, 3.0, 2.0], dtype=torch.float64), torch.tensor([0, 0, 2]))
    assert loss.count == {"all": 3, "inside": 2, "outside": 0, "none": 1}
    assert abs(loss.perplexity("all") - math.exp(2)) < 1e-9
    assert abs(loss.perplexity("inside") - math.exp(2)) < 1e-9
    assert loss.perplexity("outside") is None
    text = evidence.table([("m", 10, loss), ("unigram", None, loss)], reach=4, split="test")
    assert "| m | 10 | 7.39 | 7.39 | - | 7.39 |" in text and "| unigram | - | 7.39 |" in text
