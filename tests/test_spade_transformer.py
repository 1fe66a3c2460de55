"""The SPADE encoder-decoder: T5 buckets, incremental decoding equals the full forward (also after beam
reorders), encoder padding invariance, frozen S4, parameter count, errors."""
from __future__ import annotations

import argparse
import random
import re

import pytest
import torch
import torch.nn.functional as F
from fairseq.data import Dictionary

from cli import BIN, run_ok
from ssm_fairseq.text import spade_transformer
from ssm_fairseq.text.spade_transformer import SpadeTransformerConfig, SpadeTransformerModel
from ssm_fairseq.layers.attention.relative_position import relative_position_bucket
from ssm_fairseq.layers.state_space.ssm_ablation import ssm_outputs_zeroed

TINY = dict(embed_dim=32, ffn_embed_dim=64, attention_heads=4, encoder_layers=2, decoder_layers=2,
            attention_window=8, ssm_state_size=8, max_source_positions=256, max_target_positions=256, dropout=0.0)


class _Task:
    def __init__(self, vocabulary: int):
        self.source_dictionary = self.target_dictionary = Dictionary()
        for i in range(vocabulary - len(self.source_dictionary)):
            self.source_dictionary.add_symbol(f"w{i}")


def build(arch: str = "spade_t5_small", vocabulary: int = 40, tiny: bool = True, **overrides) -> SpadeTransformerModel:
    """The architecture ``arch``, at ``TINY``'s size unless ``tiny`` is False, with ``overrides``."""
    args = argparse.Namespace(**{**(TINY if tiny else {}), **overrides})
    getattr(spade_transformer, arch)(args)
    return SpadeTransformerModel.build_model(SpadeTransformerConfig(**vars(args)), _Task(vocabulary))


@pytest.mark.parametrize("bidirectional,distances,buckets", [
    # key minus query; bidirectional: 16 buckets per side, 8 exact, log-spaced up to 128, the last bucket beyond
    (True, [0, -1, -7, -8, -12, -127, -128, -1000, 1, 7, 8, 127, 1000], [0, 1, 7, 8, 9, 15, 15, 15, 17, 23, 24, 31, 31]),
    # causal: 32 buckets, 16 exact, keys after the query share bucket 0
    (False, [0, -1, -15, -16, -20, -127, -128, -5000, 1, 50], [0, 1, 15, 16, 17, 31, 31, 31, 0, 0]),
])
def test_relative_position_buckets_follow_t5(bidirectional, distances, buckets):
    got = relative_position_bucket(torch.tensor(distances), bidirectional, 32, 128)
    assert got.tolist() == buckets


def _full_and_incremental(model, src, src_lengths, prev, reorder_at=None, new_order=None):
    """Logits of one-token-at-a-time decoding (from the reorder on, if any) and the (reordered) targets."""
    encoder_out = model.encoder(src, src_lengths)
    steps = []
    incremental_state: dict = {}
    for t in range(prev.shape[1]):
        if t == reorder_at:
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            model.decoder.reorder_incremental_state_scripting(incremental_state, new_order)
            prev = prev.index_select(0, new_order)
        logits, _ = model.decoder(prev[:, : t + 1], encoder_out, incremental_state=incremental_state)
        steps.append(logits[:, -1])
    return torch.stack(steps[reorder_at or 0:], 1), prev


@pytest.mark.parametrize("arch", ["spade_t5_small", "t5_small_local"])
def test_incremental_decoding_equals_the_full_forward(arch):
    torch.manual_seed(0)
    model = build(arch).eval()
    src = torch.randint(4, 40, (2, 37))
    src[1, 30:] = 1  # padding
    lengths = torch.tensor([37, 30])
    prev = torch.randint(4, 40, (2, 120))
    prev[:, 0] = 2
    with torch.no_grad():
        full, _ = model(src, lengths, prev)
        steps, _ = _full_and_incremental(model, src, lengths, prev)
        torch.testing.assert_close(steps, full, atol=1e-4, rtol=1e-4)
        # a beam reorder after 60 tokens: row 1 twice, then row 0
        order = torch.tensor([1, 1, 0])
        steps, reordered = _full_and_incremental(model, src, lengths, prev, reorder_at=60, new_order=order)
        full_reordered, _ = model(src.index_select(0, order), lengths.index_select(0, order), reordered)
        torch.testing.assert_close(steps, full_reordered[:, 60:], atol=1e-4, rtol=1e-4)


def test_ssm_ablation_zeroes_the_ssm_outputs_in_the_forward_and_in_incremental_decoding():
    """``--ssm-ablation`` (what fairseq-generate gets with --model-overrides) equals the evaluation tools'
    ``ssm_outputs_zeroed`` on the same weights, also token by token, and changes what the model computes."""
    torch.manual_seed(0)
    model = build().eval()
    ablated = build(ssm_ablation=True).eval()
    ablated.load_state_dict(model.state_dict())
    src, lengths = torch.randint(4, 40, (2, 37)), torch.tensor([37, 37])
    prev = torch.randint(4, 40, (2, 20))
    prev[:, 0] = 2
    with torch.no_grad():
        full, _ = ablated(src, lengths, prev)
        with ssm_outputs_zeroed(model) as zeroed:
            assert zeroed == 2  # the encoder's and the decoder's global layer
            torch.testing.assert_close(model(src, lengths, prev)[0], full)
        steps, _ = _full_and_incremental(ablated, src, lengths, prev)
        torch.testing.assert_close(steps, full, atol=1e-4, rtol=1e-4)
        assert (model(src, lengths, prev)[0] - full).abs().max() > 1e-2
    with pytest.raises(ValueError, match="no SSM sub-layer"):
        build("t5_small_local", ssm_ablation=True)


def test_global_merge_init_scale_scales_only_the_merge_and_draws_the_same_numbers():
    """--global-merge-init-scale multiplies W of the global layers' merge; every other weight, and what the
    random generator draws, stays as with the default (so the default changes nothing)."""
    torch.manual_seed(0)
    default = build()
    torch.manual_seed(0)
    scaled = build(global_merge_init_scale=0.1)
    merges = {name for name in default.state_dict() if name.endswith("merge.weight")}
    assert len(merges) == 2  # the encoder's and the decoder's global layer
    for name, value in default.state_dict().items():
        torch.testing.assert_close(scaled.state_dict()[name], 0.1 * value if name in merges else value)


def test_at_the_default_merge_scale_the_global_layer_loses_a_tokens_own_embedding():
    """What --global-merge-init-scale is for (docs/seq2seq.md): at initialisation, the seq2seq sample's size, the
    encoder's global layer output keeps little of a token's embedding at PyTorch's scale of W, a local layer much."""
    sample = dict(embed_dim=128, ffn_embed_dim=512, attention_heads=4, encoder_layers=2, decoder_layers=2,
                  attention_window=16, ssm_state_size=32, max_source_positions=256, max_target_positions=64)
    src = torch.randint(20, 44, (4, 130))
    src[:, 60] = 10

    def kept(arch, **overrides):
        torch.manual_seed(0)
        model = build(arch, vocabulary=60, tiny=False, **sample, **overrides).eval()
        with torch.no_grad():
            out = model.encoder.layers[0](model.encoder.embed_tokens(src), None,
                                          position_bias=model.encoder.position_bias)
        return F.cosine_similarity(out[:, 60], model.encoder.embed_tokens.weight[10], dim=-1).mean().item()

    default, scaled, local = kept("spade_t5_small"), kept("spade_t5_small", global_merge_init_scale=0.1), \
        kept("t5_small_local")
    assert default < 0.3 and scaled > 0.7 and local > 0.7, (default, scaled, local)  # measured 0.13, 0.75, 0.81


def test_the_encoder_is_invariant_to_padding():
    torch.manual_seed(0)
    model = build().eval()
    short, long = torch.randint(4, 40, (1, 23)), torch.randint(4, 40, (1, 50))
    batch = torch.cat([F.pad(short, (0, 27), value=1), long])
    with torch.no_grad():
        alone = model.encoder(short)["encoder_out"][0][:, 0]
        together = model.encoder(batch, torch.tensor([23, 50]))["encoder_out"][0][:23, 0]
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_s4_a_and_b_stay_frozen_while_everything_else_trains():
    torch.manual_seed(0)
    model = build().train()
    s4_buffers = {name: b.clone() for name, b in model.named_buffers() if name.split(".")[-1] in ("B", "P", "imag",
                                                                                                 "log_neg_real")}
    assert {n.split(".")[0] for n in s4_buffers} == {"encoder", "decoder"} and len(s4_buffers) == 3 * 4
    before = {name: p.clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    src, prev = torch.randint(4, 40, (2, 30)), torch.randint(4, 40, (2, 20))
    logits, _ = model(src, torch.tensor([30, 30]), prev)
    F.cross_entropy(logits.flatten(0, 1), torch.randint(4, 40, (40,))).backward()
    optimizer.step()
    assert all(torch.equal(b, s4_buffers[name]) for name, b in model.named_buffers() if name in s4_buffers)
    unchanged = [name for name, p in model.named_parameters() if torch.equal(p, before[name])]
    assert unchanged == [], unchanged


def test_spade_t5_base_parameter_count():
    counts = {}
    for vocabulary in (32128, 50265):  # T5's SentencePiece vocabulary, RoBERTa's GPT-2 BPE
        model = build("spade_t5_base", vocabulary, tiny=False, max_source_positions=1024, max_target_positions=1024)
        counts[vocabulary] = sum(p.numel() for p in model.parameters())
    per_entry = (counts[50265] - counts[32128]) / (50265 - 32128)  # one shared 768-wide embedding row
    assert per_entry == 768
    for vocabulary, count in counts.items():
        print(f"spade_t5_base: {count / 1e6:.1f}M parameters with a vocabulary of {vocabulary}")
    for_290m = round((290e6 - counts[32128]) / per_entry + 32128)
    print(f"spade_t5_base: about 290M parameters (SPADE section 5.1) with a vocabulary of {for_290m}")
    assert 200e6 < counts[32128] < 290e6


def test_a_source_longer_than_the_s4_kernel_names_the_flag():
    model = build(max_source_positions=64).eval()
    with pytest.raises(ValueError, match="--max-source-positions 64"):
        model.encoder(torch.randint(4, 40, (1, 65)))
    with pytest.raises(ValueError, match="joined dictionary"):
        task = _Task(40)
        task.target_dictionary = Dictionary()
        args = argparse.Namespace(**TINY)
        spade_transformer.spade_t5_base(args)
        SpadeTransformerModel.build_model(SpadeTransformerConfig(**vars(args)), task)


SMALL_FLAGS = ["--embed-dim", "32", "--ffn-embed-dim", "64", "--attention-heads", "4", "--encoder-layers", "2",
               "--decoder-layers", "2", "--attention-window", "8", "--ssm-state-size", "8",
               "--max-source-positions", "256", "--max-target-positions", "256"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A tiny copy-and-reverse parallel corpus, binarised with a joined dictionary, and its monolingual side."""
    root = tmp_path_factory.mktemp("seq2seq")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(12)]
    for split, n in (("train", 64), ("valid", 8), ("test", 6)):
        src = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(n)]
        (root / f"{split}.src").write_text("".join(s + "\n" for s in src))
        (root / f"{split}.tgt").write_text("".join(" ".join(reversed(s.split())) + "\n" for s in src))
    run_ok([str(BIN / "fairseq-preprocess"), "--source-lang", "src", "--target-lang", "tgt", "--joined-dictionary",
            "--trainpref", str(root / "train"), "--validpref", str(root / "valid"), "--testpref", str(root / "test"),
            "--destdir", str(root / "bin")])
    run_ok([str(BIN / "fairseq-preprocess"), "--only-source", "--trainpref", str(root / "train.src"),
            "--validpref", str(root / "valid.src"), "--destdir", str(root / "mono")])
    return root


def test_fairseq_train_translation_then_generate_with_beam_search(corpus, tmp_path):
    run_ok([str(BIN / "fairseq-train"), str(corpus / "bin"), "--user-dir", "ssm_fairseq", "--task", "translation",
            "--arch", "spade_t5_small", *SMALL_FLAGS, "--share-all-embeddings", "--criterion",
            "label_smoothed_cross_entropy", "--optimizer", "adam", "--lr", "1e-3", "--max-update", "3",
            "--batch-size", "8", "--save-dir", str(tmp_path / "ckpt"), "--num-workers", "0", "--cpu"])
    out = run_ok([str(BIN / "fairseq-generate"), str(corpus / "bin"), "--user-dir", "ssm_fairseq", "--path",
                  str(tmp_path / "ckpt/checkpoint_last.pt"), "--beam", "4", "--max-len-b", "12", "--batch-size",
                  "3", "--required-batch-size-multiple", "1", "--cpu"])
    assert sorted(int(i) for i in re.findall(r"^H-(\d+)\t", out, flags=re.M)) == list(range(6))
    assert "BLEU4" in out
    ablated = run_ok([str(BIN / "fairseq-generate"), str(corpus / "bin"), "--user-dir", "ssm_fairseq", "--path",
                      str(tmp_path / "ckpt/checkpoint_last.pt"), "--beam", "4", "--max-len-b", "12", "--batch-size",
                      "3", "--required-batch-size-multiple", "1", "--cpu", "--model-overrides",
                      "{'ssm_ablation': True}"])
    assert "--ssm-ablation: the outputs of 2 SSM sub-layers are zeroed" in ablated
    assert sorted(int(i) for i in re.findall(r"^H-(\d+)\t", ablated, flags=re.M)) == list(range(6))


def test_fairseq_train_denoising_pretraining(corpus, tmp_path):
    out = run_ok([str(BIN / "fairseq-train"), str(corpus / "mono"), "--user-dir", "ssm_fairseq", "--task", "denoising",
                  "--arch", "spade_t5_small", *SMALL_FLAGS, "--share-all-embeddings", "--mask", "0.3",
                  "--mask-length", "span-poisson", "--poisson-lambda", "3.5", "--replace-length", "1",
                  "--tokens-per-sample", "64", "--criterion", "cross_entropy", "--optimizer", "adam", "--lr", "1e-3",
                  "--max-update", "3", "--batch-size", "4", "--required-batch-size-multiple", "1", "--save-dir",
                  str(tmp_path / "ckpt"), "--num-workers", "0",
                  "--cpu", "--log-format", "simple", "--log-interval", "1"])
    assert "num_updates 3" in out or "num_updates=3" in out
