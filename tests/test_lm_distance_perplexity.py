"""Perplexity split by distance to a word's previous occurrence, and the SSM ablation it reports."""
from __future__ import annotations

import math

import pytest
import torch

from spade_cases import SMALL, build
from ssm_fairseq.cli import lm_distance_perplexity
from ssm_fairseq.cli.bucketed_perplexity import BucketLoss
from ssm_fairseq.cli.lm_distance_perplexity import BUCKETS, distance_buckets, table, token_nll
from ssm_fairseq.layers.state_space.ssm_ablation import ssm_outputs_zeroed, ssm_sublayers


def test_buckets_count_back_within_what_the_block_sees():
    # blocks of 4 targets; reach 2. Block 2 also sees the token before it (position 3), as fairseq's blocks do.
    stream = torch.tensor([5, 6, 5, 7, 7, 6, 8, 8, 8])
    assert distance_buckets(stream, block=4, reach=2) == [
        "first", "first", "near", "first",  # 5 at 2: last seen 2 back
        "near", "first", "first", "near",   # 7 at 4: seen at 3, the token the block starts from; 6 at 1 is not seen
        "near",                             # the last, shorter block: 8 at 8 was seen at 7
    ]
    assert distance_buckets(stream, block=9, reach=2)[5] == "beyond"  # one block: 6 at 5 was last seen 4 back


ADAPTIVE = ("--adaptive-input-cutoff", "10,20", "--adaptive-softmax-cutoff", "10,20", "--adaptive-softmax-dropout", "0")


@pytest.mark.parametrize("arch, extra", [("spade_lm", ()), ("spade_lm_wiki103", ADAPTIVE)])
@pytest.mark.parametrize("softmax_elements", [1 << 24, 100])  # all positions at once; one position at a time
def test_token_nll_scores_every_token_once_from_shifted_blocks(monkeypatch, arch, extra, softmax_elements):
    monkeypatch.setattr(lm_distance_perplexity, "SOFTMAX_ELEMENTS", softmax_elements)
    model, _, task = build(arch, *SMALL, *extra, tokens_per_sample=16)
    model.eval()
    stream = torch.randint(4, 30, (37,))
    eos = task.source_dictionary.eos()
    nll = token_nll(model, stream, block=16, eos=eos, batch_size=2, device=torch.device("cpu"))
    # brute force: each token from its own block's prefix, one sequence at a time
    source = torch.cat([torch.tensor([eos]), stream[:-1]])
    expected = []
    for start in range(0, 37, 16):
        end = min(start + 16, 37)
        lprobs = model.get_normalized_probs(model(source[start:end][None]), log_probs=True)[0]
        expected += [-lprobs[i, stream[start + i]].item() for i in range(end - start)]
    torch.testing.assert_close(nll, torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-5)


def test_bucket_perplexities_and_table():
    loss = BucketLoss(BUCKETS)
    loss.add(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), torch.tensor([0, 0, 2]))  # near, near, first
    assert loss.perplexity("near") == pytest.approx(math.exp(1.5))
    assert loss.perplexity("all") == pytest.approx(math.exp(2.0))
    assert loss.perplexity("beyond") is None
    text = table([("m", 10, [loss])], reach=32, block=512)
    assert "| m | 10 | 7.39 | 4.48 | - | 20.09 |" in text and "(3 tokens)" in text
    other = BucketLoss(BUCKETS)
    other.add(torch.tensor([3.0, 4.0, 5.0], dtype=torch.float64), torch.tensor([0, 0, 2]))
    text = table([("m", 10, [loss, other])], reach=32, block=512)  # two seeds: mean (min-max)
    assert "| m (2 runs) | 10 | 30.99 (7.39-54.60) | 18.80 (4.48-33.12) | - | 84.25 (20.09-148.41) |" in text


def test_zeroing_the_ssm_removes_its_contribution_and_only_within_the_block():
    model, _, _ = build("spade_lm", *SMALL)
    model.eval()
    tokens = torch.randint(4, 30, (2, 20))
    before = model(tokens)[0]
    with ssm_outputs_zeroed(model) as zeroed:
        ablated = model(tokens)[0]
    assert zeroed == 2 == len(ssm_sublayers(model))  # SMALL has two global layers
    torch.testing.assert_close(model(tokens)[0], before)  # the hooks are gone
    assert not torch.allclose(ablated, before)
    # independent: the same weights with every SSM sub-layer replaced by a module that outputs zeros
    for layer in model.decoder.layers:
        if layer.ssm is not None:
            layer.ssm = _Zeros()
    torch.testing.assert_close(model(tokens)[0], ablated)


def test_zeroing_a_model_without_ssm_is_an_error():
    model, _, _ = build("spade_lm", *SMALL[:-2], "--global-layers", "0")
    with pytest.raises(ValueError, match="no SSM sub-layer"):
        with ssm_outputs_zeroed(model):
            pass


class _Zeros(torch.nn.Module):
    def forward(self, x, padding_mask=None):
        return torch.zeros_like(x)
