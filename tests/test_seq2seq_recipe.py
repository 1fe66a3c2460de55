"""The seq2seq recipe through fairseq's CLIs on the generated sample: denoising, fine-tuning, generation, table."""
from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

import pytest
from fairseq.data import Dictionary, data_utils

from cli import BIN, REPO, run_ok

pytestmark = pytest.mark.slow

ARCHS = ("spade_t5_small", "t5_small_local")
TINY = ("--embed-dim 32 --ffn-embed-dim 64 --attention-heads 4 --encoder-layers 2 --decoder-layers 2 "
        "--attention-window 16 --ssm-state-size 8 --max-source-positions 1024 --max-target-positions 512")


def recipe_env(work: Path, **extra) -> dict:
    return dict(os.environ, WORK_DIR=str(work), PYTHON_BIN=str(BIN), COPY_EXAMPLES="40", COPY_DISTANCE="100",
                PRETRAIN_UPDATES="2", FINETUNE_UPDATES="80", MODEL_ARGS=TINY, PRETRAIN_ARGS="--cpu --num-workers 0",
                FINETUNE_ARGS="--cpu --num-workers 0", GENERATE_ARGS="--cpu", **extra)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> tuple[Path, str]:
    work = tmp_path_factory.mktemp("seq2seq")
    return work, run_ok(["bash", "recipes/seq2seq/run.sh"], env=recipe_env(work))


def test_every_stage_runs_and_fine_tuning_starts_from_pre_training(recipe):
    work, out = recipe
    for arch in ARCHS:
        assert "num_updates 2" in (work / f"pretrain_{arch}.log").read_text()
        finetune = (work / f"finetune_{arch}.log").read_text()
        assert f"Loaded checkpoint {work}/checkpoints/{arch}/pretrain/checkpoint_last.pt" in finetune
        generated = (work / f"generate_{arch}.txt").read_text()
        assert len(re.findall(r"^H-\d+\t", generated, flags=re.M)) == 50  # every test example, beam 4
        row = re.search(rf"^\| {arch} \| 50 \| ([0-9.]+) \| ([0-9.]+) \|$", out, flags=re.M)
        assert row and 0 <= float(row.group(1)) <= 100, out[-2000:]


def test_fine_tuning_learns_the_targets(recipe):
    """The copy task itself is beyond this budget (exactly right: 0%), but the models must learn which pieces
    targets are made of: valid bits per target piece well below uniform guessing over the dictionary."""
    work, _ = recipe
    vocabulary = len((work / "dict.with-mask.txt").read_text().splitlines()) + 4  # fairseq's 4 specials
    for arch in ARCHS:
        log = (work / f"finetune_{arch}.log").read_text()
        valid = re.findall(r"valid on 'valid' subset .*? nll_loss ([0-9.]+) ", log)
        # 241 pieces: uniform guessing 7.9 bits; measured after 80 updates 5.37 (spade) and 5.61 (local), after 2
        # updates 8.00 and 8.68
        assert valid and float(valid[-1]) < math.log2(vocabulary) - 1.5, (arch, valid, vocabulary)


def test_no_unknown_pieces_in_the_pretraining_data(recipe):
    """The dictionary covers the pre-training text too (it was built from the pairs only: 91% <unk>)."""
    work, _ = recipe
    dictionary = Dictionary.load(str(work / "dict.txt"))
    for split in ("train", "valid"):
        dataset = data_utils.load_indexed_dataset(str(work / f"data-bin/pretrain/{split}"), dictionary)
        assert len(dataset) > 0
        assert sum(int((dataset[i] == dictionary.unk()).sum()) for i in range(len(dataset))) == 0, split


def test_the_source_is_far_longer_than_the_attention_window(recipe):
    work, _ = recipe
    sources = (work / "bpe/test.src").read_text().splitlines()
    assert min(len(s.split()) for s in sources) > 100 > 16  # the key is > 100 pieces before the end


def test_the_recipe_restarts_at_the_table_and_fails_when_nothing_was_scored(recipe, tmp_path):
    work, _ = recipe
    out = run_ok(["bash", "recipes/seq2seq/run.sh", "--stage", "6"], env=recipe_env(work))
    assert all(f"| {arch} | 50 |" in out for arch in ARCHS)
    (tmp_path / "generate_spade_t5_small.txt").write_text("no hypotheses\n")
    result = subprocess.run(["bash", "recipes/seq2seq/run.sh", "--stage", "6"], capture_output=True, text=True,
                            cwd=REPO, env=recipe_env(tmp_path, ARCHS="spade_t5_small"))
    assert result.returncode != 0 and "nothing to score" in result.stderr
