"""Cross-attention weights kept for diagnostics, and ``ssm-seq2seq-attention``'s share on the predicted token's
copies, against attention made uniform by construction, and its encoder spread against encodings fixed by hand."""
from __future__ import annotations

import pytest
import torch

import test_spade_transformer
from ssm_fairseq.cli.seq2seq_attention import attention_on_copies, encoder_spread
from ssm_fairseq.layers.attention.cross_attention import CrossAttention


def test_kept_weights_are_the_softmax_the_output_is_made_of_and_change_nothing():
    torch.manual_seed(0)
    attention = CrossAttention(16, 4).eval()
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 7, 16)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, 5:] = True
    plain = attention(x, memory, padding)
    attention.keep_weights = True
    kept = attention(x, memory, padding)
    weights = attention.last_weights
    assert torch.equal(plain, kept)
    assert weights.shape == (2, 4, 3, 7)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 3))
    assert weights[1, :, :, 5:].abs().max() == 0  # padding gets nothing
    v = attention.kv_proj(memory).view(2, 7, 2, 4, 4)[:, :, 1].transpose(1, 2)  # B x heads x S x 4
    rebuilt = attention.out_proj((weights @ v).transpose(1, 2).reshape(2, 3, 16))
    assert torch.allclose(rebuilt, kept, atol=1e-6)


def test_uniform_attention_gives_each_token_its_share_of_the_source():
    """With every decoder query projection zeroed, attention is uniform: the share on the copies of each target
    token is their count over the source length, what the table prints as uniform."""
    torch.manual_seed(0)
    model = test_spade_transformer.build().eval()
    for module in model.decoder.modules():
        if isinstance(module, CrossAttention):
            torch.nn.init.zeros_(module.q_proj.weight)
            torch.nn.init.zeros_(module.q_proj.bias)
    dataset = [{"source": torch.tensor([5, 6, 7, 5, 8, 5, 9, 2]), "target": torch.tensor([5, 9, 2])},
               {"source": torch.tensor([10, 11, 12, 13, 2]), "target": torch.tensor([11, 20, 2])}]
    shares, uniform, counts = attention_on_copies(model, dataset, positions=3)
    assert counts == [2, 1, 2]  # token 20 is in no source; the final eos is in both
    assert uniform == pytest.approx([(3 / 8 + 1 / 5) / 2, 1 / 8, (1 / 8 + 1 / 5) / 2])
    for p in range(3):
        for layer in shares[p]:
            assert torch.allclose(layer, torch.full_like(layer, uniform[p]))
    assert all(not module.keep_weights for module in model.modules() if isinstance(module, CrossAttention))


class FixedEncoder(torch.nn.Module):
    """An encoder whose output at a position is ``vectors[piece] + shifts[position]`` (``L x 1 x D``, as fairseq's)."""

    def __init__(self, vectors: torch.Tensor, shifts: torch.Tensor):
        super().__init__()
        self.vectors, self.shifts = vectors, shifts

    def forward(self, tokens, lengths):
        return {"encoder_out": [(self.vectors[tokens[0]] + self.shifts[:tokens.shape[1]])[:, None]]}


def test_the_encoder_spread_is_the_distances_between_and_around_the_pieces_encodings():
    vectors = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 8.0], [6.0, 0.0]])
    model = type("Model", (), {})()
    dataset = [{"source": torch.tensor([1, 2, 1])}, {"source": torch.tensor([3, 1])}]
    model.encoder = FixedEncoder(vectors, torch.zeros(3, 2))  # each piece's encoding the same everywhere
    norm, between, within = encoder_spread(model, dataset)
    assert norm == pytest.approx((5 + 8 + 5 + 6 + 5) / 5)
    assert between == pytest.approx((5 + 5 + 10) / 3)  # |v1 - v2|, |v1 - v3|, |v2 - v3|
    assert within == 0
    model.encoder = FixedEncoder(vectors, torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.0]]))
    norm, between, within = encoder_spread(model, dataset)
    # piece 1 at positions 0, 2, 1: shifts (1, 0), (0, 0), (-1, 0), its mean stays (3, 4); piece 2 once, at
    # position 1: (-1, 8); piece 3 once, at position 0: (7, 0)
    assert between == pytest.approx((32 ** 0.5 + 32 ** 0.5 + 128 ** 0.5) / 3)
    assert within == pytest.approx((1 + 0 + 1 + 0 + 0) / 5)
    with pytest.raises(ValueError, match="fewer than two different pieces"):
        encoder_spread(model, [{"source": torch.tensor([1, 1])}])
