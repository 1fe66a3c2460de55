"""The ``mssm_roberta`` masked LM: Table 4's parameter counts, padding invariance, a 4096-token training step,
classification heads across checkpoints, sinusoidal positions and the sample conf's equal sizes."""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fairseq.data import Dictionary
from fairseq.dataclass.utils import gen_parser_from_dataclass
from omegaconf import OmegaConf

from ssm_fairseq.text import mssm_roberta
from ssm_fairseq.text.mssm_roberta import MaskedLMConfig, MaskedSSMLanguageModel

REPO = Path(__file__).resolve().parents[1]
TINY = dict(encoder_layers=2, encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_attention_heads=4,
            ssm_heads=4, ssm_state_size=8, attention_window=16, dropout=0.0)


class _Task:
    def __init__(self, vocabulary: int):
        self.source_dictionary = Dictionary()
        for i in range(vocabulary - len(self.source_dictionary) - 1):
            self.source_dictionary.add_symbol(f"w{i}")
        self.source_dictionary.add_symbol("<mask>")  # as fairseq's masked_lm task does


def build(arch: str, vocabulary: int = 100, max_positions: int = 4096, **overrides) -> MaskedSSMLanguageModel:
    """The architecture ``arch`` with ``overrides`` (fairseq's order: user values first, then arch defaults)."""
    args = argparse.Namespace(**overrides)
    getattr(mssm_roberta, arch)(args)
    cfg = MaskedLMConfig(**vars(args), max_positions=max_positions)
    return MaskedSSMLanguageModel.build_model(cfg, _Task(vocabulary))


# MSSM paper Table 4. Its sliding-window model (434.7M) is Longformer-large, which carries separate query/key/
# value projections for global attention in every layer (3 x (1024^2 + 1024) x 24); a pure sliding window never
# uses them, so ours is compared with Table 4's count less those.
LONGFORMER_GLOBAL_PROJECTIONS = 24 * 3 * (1024 * 1024 + 1024)
TABLE_4 = {"mssm_roberta_large": 416.1e6, "local_roberta_large": 434.7e6 - LONGFORMER_GLOBAL_PROJECTIONS}


@pytest.mark.parametrize("arch", sorted(TABLE_4))
def test_parameter_counts_match_table_4(arch):
    vocabulary = 50265 + 1  # GPT-2 BPE in fairseq's RoBERTa dictionary, plus <mask>
    # identical layers: count(24) = count(1) + 23 x (count(2) - count(1)), without building 400M parameters
    one, two = (sum(p.numel() for p in build(arch, vocabulary, encoder_layers=n).parameters()) for n in (1, 2))
    count = one + 23 * (two - one)
    print(f"{arch}: {count / 1e6:.1f}M parameters with a vocabulary of {vocabulary} "
          f"(Table 4 reference {TABLE_4[arch] / 1e6:.1f}M)")
    assert abs(count - TABLE_4[arch]) / TABLE_4[arch] < 0.05


@pytest.mark.parametrize("arch", ["mssm_roberta_base", "local_roberta_base"])
def test_a_document_alone_equals_itself_in_a_padded_batch(arch):
    torch.manual_seed(0)
    model = build(arch, **TINY).eval()
    pad = model.encoder.padding_idx
    short, long = torch.randint(4, 100, (1, 37)), torch.randint(4, 100, (1, 90))
    batch = torch.cat([F.pad(short, (0, 90 - 37), value=pad), long])
    with torch.no_grad():
        alone, _ = model(short, features_only=True)
        together, _ = model(batch, features_only=True)
        logits, _ = model(short)
    torch.testing.assert_close(together[0, :37], alone[0], atol=1e-5, rtol=1e-5)
    assert logits.shape == (1, 37, 100)


@pytest.mark.parametrize("arch", ["mssm_roberta_base", "local_roberta_base"])
def test_one_training_step_at_4096_tokens(arch):
    torch.manual_seed(0)
    model = build(arch, **TINY).train()
    tokens = torch.randint(4, 100, (1, 4096))
    masked = torch.rand(tokens.shape) < 0.15
    logits, _ = model(tokens.masked_fill(masked, 99), masked_tokens=masked)
    loss = F.cross_entropy(logits, tokens[masked])
    loss.backward()
    assert logits.shape == (masked.sum(), 100) and torch.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.count_nonzero() > 0, name


def test_classification_heads_follow_the_checkpoint_rules():
    torch.manual_seed(0)
    pretrained = build("mssm_roberta_base", **TINY)
    state = pretrained.state_dict()
    finetuned = build("mssm_roberta_base", **TINY)
    finetuned.register_classification_head("topic", num_classes=3)
    finetuned.upgrade_state_dict_named(state, "")  # fine-tuning adds the new head to a pre-trained state
    finetuned.load_state_dict(state, strict=True)
    logits, _ = finetuned(torch.randint(4, 100, (2, 20)), classification_head_name="topic")
    assert logits.shape == (2, 3)

    with_head = finetuned.state_dict()
    plain = build("mssm_roberta_base", **TINY)
    plain.upgrade_state_dict_named(with_head, "")  # a head the model does not have is dropped ...
    plain.load_state_dict(with_head, strict=True)
    keeping = build("mssm_roberta_base", load_checkpoint_heads=True, **TINY)
    keeping.upgrade_state_dict_named(finetuned.state_dict(), "")  # ... unless asked to keep it
    assert "topic" in keeping.classification_heads


def test_local_layers_need_positions_and_say_so():
    with pytest.raises(ValueError, match="--encoder-learned-pos"):
        build("local_roberta_base", encoder_learned_pos=False, **TINY)
    model = build("local_roberta_base", max_positions=64, **TINY)
    with pytest.raises(ValueError, match="--max-positions 64"):
        model(torch.randint(4, 100, (1, 65)))


def test_both_kinds_of_positions_are_refused_together():
    with pytest.raises(ValueError, match="exclude each other"):
        build("local_roberta_base", encoder_learned_pos=True, encoder_sinusoidal_pos=True, **TINY)


def test_sinusoidal_positions_tell_the_local_model_where_a_token_is_without_parameters():
    torch.manual_seed(0)
    learned = build("local_roberta_base", max_positions=512, **TINY)
    sinusoidal = build("local_roberta_base", max_positions=512, encoder_sinusoidal_pos=True, **TINY).eval()
    assert not sinusoidal.encoder.embed_positions.state_dict()  # nothing saved, nothing trained
    dim = TINY["encoder_embed_dim"]
    # the learned table: max_positions + padding_idx + 1 rows (fairseq's offset for padding)
    assert (sum(p.numel() for p in learned.parameters()) - sum(p.numel() for p in sinusoidal.parameters())
            == (512 + sinusoidal.encoder.padding_idx + 1) * dim)
    # at the scale the token embeddings start at (N(0, 0.02)), not 35 times theirs: positions do not drown tokens
    tokens = torch.randint(4, 100, (1, 512))
    encoder = sinusoidal.encoder
    positions = encoder.position_scale * encoder.embed_positions(tokens)
    assert 0.9 < positions.pow(2).mean().sqrt() / encoder.embed_tokens(tokens).pow(2).mean().sqrt() < 1.1
    # one token repeated: without positions every output would be the same; with them each position differs
    with torch.no_grad():
        features, _ = sinusoidal(torch.full((1, 40), 7), features_only=True)
    assert (features[0, 1:] - features[0, :-1]).abs().amax(-1).min() > 1e-3


def _conf_model_args(arch: str) -> list[str]:
    """``MODEL_ARGS`` and ``model_args_ARCH`` of ``recipes/mlm/conf/sample.sh``, as the recipe passes them."""
    script = f'work_dir=x; source recipes/mlm/conf/sample.sh; own="model_args_{arch}"; echo "$model_args ${{!own:-}}"'
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODEL_ARGS")}  # the conf's own values
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, cwd=REPO,
                          env=env).stdout.split()


def test_the_sample_conf_gives_both_models_the_same_size():
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)  # as fairseq parses a model's flags
    gen_parser_from_dataclass(parser, MaskedLMConfig(), delete_default=True)
    vocabulary = 256 + 4 + 1  # the conf's SentencePiece pieces, fairseq's specials and <mask>
    counts = {}
    for arch in ("mssm_roberta_base", "local_roberta_base"):
        args = parser.parse_args(_conf_model_args(arch))
        getattr(mssm_roberta, arch)(args)
        cfg = MaskedLMConfig(**vars(args), max_positions=4096)
        model = MaskedSSMLanguageModel.build_model(cfg, _Task(vocabulary))
        counts[arch] = sum(p.numel() for p in model.parameters())
    print(counts)
    assert counts["mssm_roberta_base"] != counts["local_roberta_base"]  # not the same model twice
    assert abs(counts["local_roberta_base"] - counts["mssm_roberta_base"]) / counts["mssm_roberta_base"] < 0.05


def test_a_config_saved_before_sinusoidal_positions_loads_as_trained():
    torch.manual_seed(0)
    old = build("local_roberta_base", max_positions=256, **TINY).eval()
    saved = OmegaConf.create({k: v for k, v in dataclasses.asdict(old.args).items() if k != "encoder_sinusoidal_pos"})
    assert "encoder_sinusoidal_pos" not in saved and saved.encoder_learned_pos
    loaded = MaskedSSMLanguageModel.build_model(saved, _Task(100)).eval()
    loaded.load_state_dict(old.state_dict(), strict=True)
    assert not loaded.args.encoder_sinusoidal_pos
    tokens = torch.randint(4, 100, (1, 50))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens)[0], old(tokens)[0])


def test_mssm_scale_sets_the_kernels_initial_eigenvalues():
    """``--mssm-scale``: ``z_Lambda ~ N(ln(scale), 1)`` in every MSSM kernel (0.5, the transducer's default, if not
    given). 8 kernels of 4 heads x 8 states here: the mean of the 256 draws lies within 4 standard errors."""
    torch.manual_seed(0)
    for scale in (0.5, 0.02):
        model = build("mssm_roberta_base", **TINY, **({} if scale == 0.5 else {"mssm_scale": scale}))
        z = [p.detach().flatten() for name, p in model.named_parameters() if name.endswith("z_lambda")]
        assert len(z) == 2 * TINY["encoder_layers"] * 2  # layers x directions x stacked stages
        draws = torch.cat(z)
        assert abs(draws.mean().item() - math.log(scale)) < 4 / math.sqrt(draws.numel()), draws.mean()


def test_mssm_scale_per_head():
    """``--mssm-scale 0.5,0.005``: each head's ``z_Lambda`` rows drawn around its own ``ln(scale)``."""
    torch.manual_seed(0)
    model = build("mssm_roberta_base", **dict(TINY, ssm_heads=2), mssm_scale="0.5,0.005")
    z = torch.stack([p.detach() for name, p in model.named_parameters() if name.endswith("z_lambda")])  # k x 2 x 8
    for head, scale in enumerate((0.5, 0.005)):
        assert abs(z[:, head].mean().item() - math.log(scale)) < 4 / math.sqrt(z[:, head].numel())
    with pytest.raises(ValueError, match="one per head"):
        build("mssm_roberta_base", **dict(TINY, ssm_heads=2), mssm_scale="0.5,0.5,0.5")
