"""spade_lm's token store (``text/token_store.py``): rows branched, stepped together and dropped as a search does
score what the full forward pass over each row's prefix scores, past several windows and through compactions."""
from __future__ import annotations

import random

import pytest
import torch

from spade_cases import SMALL, build
from ssm_fairseq.text import token_store
from ssm_fairseq.text.token_store import WindowTokenStore

EOS = 2


def full_log_probs(model, prefix: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model.get_normalized_probs(model.decoder(torch.tensor([prefix])), log_probs=True)[0, -1]


@pytest.mark.parametrize("arch, flags", [("spade_lm", SMALL), ("spade_lm", (*SMALL, "--local-attention", "chunk")),
                                         ("local_lm", SMALL[:-2])])
def test_branched_stepped_and_dropped_rows_score_their_full_forward(arch, flags, monkeypatch):
    """Window 8; rows of lengths 1 to 30 (full windows, chunks at every phase, a local_lm's own positions) step
    together, branch (a row extended by several labels) and are dropped at random; the store is compacted (over 24
    keys, twice what the kept rows' windows can name) several times."""
    monkeypatch.setattr(token_store, "COMPACT_SLOTS", 24)
    torch.manual_seed(3)
    model = build(arch, *flags)[0].eval()
    store = model.decoder.token_store()
    assert isinstance(store, WindowTokenStore)
    rng = random.Random(1)
    got = store.start((EOS,), 3)
    prefixes = {row: [EOS] for row in range(3)}
    for row in prefixes:
        assert torch.allclose(got[row], full_log_probs(model, [EOS]), atol=1e-5)
    compacted = 0
    for step in range(60):
        longest = sorted(prefixes, key=lambda row: len(prefixes[row]))
        parents = rng.choices(longest[-3:], k=rng.randint(1, 3)) + rng.choices(list(prefixes), k=rng.randint(0, 2))
        labels = [rng.randrange(4, 30) for _ in parents]
        first = len(store)
        got = store.advance(parents, labels)
        assert got.shape == (len(parents), 30) and len(store) == first + len(parents)
        for i, (parent, label) in enumerate(zip(parents, labels)):
            prefixes[first + i] = prefixes[parent] + [label]
            assert torch.allclose(got[i], full_log_probs(model, prefixes[first + i]), atol=1e-4), (step, i)
        if step % 4 == 3:
            kept = sorted(rng.sample(list(prefixes), k=min(len(prefixes), rng.randint(2, 3))))
            used = store._used
            store.keep(kept)
            compacted += store._used < used
            prefixes = {new: prefixes[old] for new, old in enumerate(kept)}
    assert max(len(p) for p in prefixes.values()) >= 25 and compacted >= 2
    # the kept rows, stepped once more after the last drop, still score their own prefixes
    rows = list(prefixes)
    got = store.advance(rows, [5] * len(rows))
    for i, row in enumerate(rows):
        assert torch.allclose(got[i], full_log_probs(model, prefixes[row] + [5]), atol=1e-4)


def test_a_decoder_with_cross_attention_or_mixed_windows_is_refused():
    model = build("spade_lm", *SMALL)[0].eval()
    model.decoder.layers[1].attention.window = 4
    with pytest.raises(ValueError, match="same attention window"):
        model.decoder.token_store()
