"""``ssm-mlm-reach``: a sliding-window model's first token does not move for text beyond its layers x window, and
moves for text within it; an MSSM model's moves at any distance."""
from __future__ import annotations

import math

import pytest
import torch

from ssm_fairseq.cli.mlm_reach import first_token_change, table
from test_mssm_roberta import TINY, build  # the tiny masked LMs of the model's own tests


def test_the_window_bounds_the_first_tokens_reach_and_the_ssm_does_not():
    torch.manual_seed(0)
    reach = TINY["encoder_layers"] * TINY["attention_window"]  # 2 x 16
    blocks = [torch.randint(4, 100, (200,)) for _ in range(2)]
    distances = [1, reach - 8, reach + 1, 150, 195]
    local = first_token_change(build("local_roberta_base", encoder_sinusoidal_pos=True, **TINY).eval(), blocks,
                               distances, span=8, seed=1)
    assert local[1][0] > 0.01 and local[reach - 8][0] > 0  # the span ends at the reach: seen through two layers
    assert local[reach + 1][0] == 0 and local[150][0] == 0  # beyond it: not a bit of the features moves
    assert math.isnan(local[195][0]) and local[195][1] == 0  # 195 + 8 > 200: no block that long
    mssm = first_token_change(build("mssm_roberta_base", **TINY).eval(), blocks, distances, span=8, seed=1)
    assert all(mssm[d][0] > 0 and mssm[d][1] == 2 for d in (1, reach + 1, 150))
    text = table([("local", local), ("mssm", mssm)], span=8, split="test")
    assert "d = 195 (0 blocks)" in text and "no block that long" in text and "d = 150 (2 blocks)" in text
