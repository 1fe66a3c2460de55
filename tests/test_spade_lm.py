"""The SPADE language model: incremental decoding equals the full forward, beams, frozen S4, architectures."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fairseq import optim

from spade_cases import SMALL, build


def _incremental_log_probs(model, tokens: torch.Tensor, pieces: list[int] | None = None, reorder_at=None):
    """Log-probabilities of every position, feeding the growing prefix through fairseq's incremental state."""
    state, outputs, end = {}, [], 0
    for size in pieces or [1] * tokens.shape[1]:
        end += size
        if reorder_at is not None and end - size == reorder_at[0]:
            model.decoder.reorder_incremental_state_scripting(state, reorder_at[1])
            tokens = tokens.index_select(0, reorder_at[1])
            outputs = [o.index_select(0, reorder_at[1]) for o in outputs]
        logits, _ = model.decoder(tokens[:, :end], incremental_state=state)
        outputs.append(model.get_normalized_probs((logits, None), log_probs=True))
    return torch.cat(outputs, dim=1), tokens


def _full_log_probs(model, tokens):
    return model.get_normalized_probs(model(tokens), log_probs=True)


def _branch(state):
    """A copy of an incremental state's dicts and lists sharing its tensors and objects, as a search branches one
    (a reorder replaces the copy's tensors and leaves the original as it was)."""
    if isinstance(state, dict):
        return {key: _branch(value) for key, value in state.items()}
    if isinstance(state, list):
        return [_branch(value) for value in state]
    return state


@pytest.mark.parametrize("arch, flags", [("spade_lm", SMALL), ("spade_lm", (*SMALL, "--local-attention", "chunk")),
                                         ("local_lm", SMALL[:-2])])
def test_rows_of_different_lengths_step_together_as_each_alone(arch, flags):
    """Rows fed 3, 12, 6 and 6 tokens (window 8: windows full and not, chunks at different phases; local_lm: each
    row's own positions) in three states, concatenated and stepped by 1 new token a row (each prefix left-padded to
    the longest), the longest row dropped, then stepped by 3 more: each row's log-probabilities are its full
    forward pass's. A prefix padded otherwise is refused."""
    model = build(arch, *flags)[0].eval()
    decoder, pad = model.decoder, model.decoder.padding_idx
    torch.manual_seed(5)
    tokens = torch.randint(4, 30, (4, 20))
    seen = [3, 12, 6, 6]
    with torch.no_grad():
        full = _full_log_probs(model, tokens)
        start: dict = {}
        decoder(tokens[:, :1], incremental_state=start)  # every row's first token in one state, as a search starts
        states = []
        for rows in ([0], [1], [2, 3]):
            state = _branch(start)
            decoder.reorder_incremental_state_scripting(state, torch.tensor(rows))
            decoder(tokens[rows, : seen[rows[0]]], incremental_state=state)
            states.append(state)
        state = decoder.concatenate_incremental_states(states)
        rows = [0, 1, 2, 3]
        for n in (1, 3):
            width = max(seen[b] for b in rows) + n
            prefixes = torch.stack([F.pad(tokens[b, : seen[b] + n], (width - seen[b] - n, 0), value=pad)
                                    for b in rows])
            if n == 1:
                right = torch.stack([F.pad(tokens[b, : seen[b] + n], (0, width - seen[b] - n), value=pad) for b in rows])
                with pytest.raises(ValueError, match="left-padded"):
                    decoder(right, incremental_state=state)
            got = model.get_normalized_probs(decoder(prefixes, incremental_state=state), log_probs=True)
            for i, b in enumerate(rows):
                assert torch.allclose(got[i], full[b, seen[b] : seen[b] + n], atol=1e-4)
            seen = [s + n if b in rows else s for b, s in enumerate(seen)]
            if n == 1:
                decoder.reorder_incremental_state_scripting(state, torch.tensor([0, 2, 3]))
                rows = [0, 2, 3]


@pytest.mark.parametrize("ssm", ["s4", "s4d", "dss", "mssm"])
@pytest.mark.parametrize("attention", ["window", "chunk"])
def test_incremental_log_probs_equal_the_full_forward(ssm, attention):
    model = build("spade_lm", *SMALL, "--ssm", ssm, "--local-attention", attention)[0].eval()
    tokens = torch.randint(4, 30, (2, 200))
    with torch.no_grad():
        full = _full_log_probs(model, tokens)
        step, _ = _incremental_log_probs(model, tokens)
        pieces, _ = _incremental_log_probs(model, tokens, pieces=[5, 1, 17, 3, 90, 84])
    assert torch.allclose(step, full, atol=1e-4)
    assert torch.allclose(pieces, full, atol=1e-4)


def test_local_baseline_has_sinusoidal_positions_and_decodes_incrementally():
    model = build("local_lm", *SMALL[:-2])[0].eval()
    assert model.decoder.embed_positions is not None and build("spade_lm", *SMALL)[0].decoder.embed_positions is None
    tokens = torch.randint(4, 30, (2, 60))
    with torch.no_grad():
        full = _full_log_probs(model, tokens)
        assert torch.allclose(_incremental_log_probs(model, tokens, pieces=[7, 1, 30, 22])[0], full, atol=1e-4)
        # the positions matter: without them a window-attention stack cannot tell the order inside its window
        model.decoder.embed_positions = None
        assert not torch.allclose(_full_log_probs(model, tokens), full, atol=1e-3)


def test_a_local_baseline_saved_before_positions_existed_loads_without_them():
    from fairseq import models
    from omegaconf import open_dict
    _, cfg, task = build("local_lm", *SMALL[:-2])
    assert cfg.model.positional_embeddings == "sinusoidal"
    with open_dict(cfg.model):
        del cfg.model["positional_embeddings"]  # as an earlier release saved it (its local models had no positions)
    assert models.build_model(cfg.model, task).decoder.embed_positions is None


def test_beam_reordering_keeps_incremental_equal_to_full():
    model = build("spade_lm", *SMALL)[0].eval()
    tokens = torch.randint(4, 30, (3, 60))
    new_order = torch.tensor([2, 0, 0])
    with torch.no_grad():
        step, reordered = _incremental_log_probs(model, tokens, reorder_at=(25, new_order))
        full = _full_log_probs(model, reordered)
    assert torch.allclose(step, full, atol=1e-4)


def test_adaptive_input_and_softmax_architecture_decodes_incrementally():
    model = build("spade_lm_wiki103", *SMALL, "--adaptive-input-cutoff", "10,20", "--adaptive-softmax-cutoff",
                  "10,20", "--adaptive-softmax-dropout", "0")[0].eval()
    assert model.decoder.adaptive_softmax is not None
    tokens = torch.randint(4, 30, (2, 40))
    with torch.no_grad():
        assert torch.allclose(_incremental_log_probs(model, tokens)[0], _full_log_probs(model, tokens), atol=1e-4)


def test_frozen_s4_does_not_change_and_the_rest_trains():
    model, cfg, task = build("spade_lm", *SMALL)
    kernel = model.decoder.layers[0].ssm.kernel
    frozen = {name: buf.clone() for name, buf in kernel.named_buffers()}
    assert {"log_neg_real", "imag", "P", "B"} <= set(frozen)
    assert not any(n.endswith(("log_neg_real", "imag", ".P", ".B")) for n, _ in model.named_parameters())
    optimizer = optim.build_optimizer(cfg.optimizer, list(model.parameters()))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    tokens = torch.randint(4, 30, (2, 50))
    lprobs = _full_log_probs(model.train(), tokens)
    optimizer.backward(-lprobs[:, :-1].gather(-1, tokens[:, 1:, None]).sum())
    optimizer.step()
    assert all(torch.equal(buf, frozen[name]) for name, buf in kernel.named_buffers())
    assert all(not torch.equal(before[name], p) for name, p in model.named_parameters())


def test_trainable_s4_flag_makes_a_and_b_parameters():
    model = build("spade_lm", *SMALL, "--train-ssm-ab")[0]
    names = {n for n, _ in model.decoder.layers[0].ssm.kernel.named_parameters()}
    assert {"log_neg_real", "imag", "P", "B"} <= names


def test_architectures_set_the_papers_configuration():
    model = build("spade_lm_wiki103", tokens_per_sample=3072, vocab_size=70000)[0]
    d = model.decoder
    assert len(d.layers) == 16 and d.layers[0].ssm is not None and all(l.ssm is None for l in d.layers[1:])
    assert d.layers[1].attention.window == 512 and d.layers[0].ffn.net[0].out_features == 4096
    assert d.adaptive_softmax is not None and d.max_positions() == 3072
    local = build("local_lm_wiki103", tokens_per_sample=3072, vocab_size=70000)[0].decoder
    assert all(layer.ssm is None for layer in local.layers)
    small_local = build("local_lm", *SMALL[:-2])[0].decoder
    assert len(small_local.layers) == 3 and all(layer.ssm is None for layer in small_local.layers)
    print(f"spade_lm_wiki103: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")


def test_global_layers_flag_sets_the_bottom_k():
    model = build("spade_lm", *SMALL[:-2], "--global-layers", "2", "--decoder-layers", "4")[0]
    assert [layer.ssm is not None for layer in model.decoder.layers] == [True, True, False, False]


def test_padding_never_reaches_earlier_tokens_and_lengths_beyond_l_max_are_rejected():
    model = build("spade_lm", *SMALL, tokens_per_sample=64)[0].eval()
    tokens = torch.randint(4, 30, (2, 40))
    padded = tokens.clone()
    padded[1, 30:] = model.decoder.padding_idx
    with torch.no_grad():
        assert torch.allclose(_full_log_probs(model, tokens)[1, :30], _full_log_probs(model, padded)[1, :30],
                              atol=1e-5)
        with pytest.raises(ValueError, match="l_max"):
            model(torch.randint(4, 30, (1, 65)))
