"""``fairseq-train`` resumed from ``checkpoint_last.pt`` in mid-epoch repeats the uninterrupted run exactly.

Each case trains once without interruption, saving a checkpoint in mid-epoch (``--save-interval-updates``), then
again in a fresh directory holding only that checkpoint as ``checkpoint_last.pt``, as a run killed right after
saving it and restarted with the same command. With dropout on, the resumed run must log the uninterrupted run's
loss at every later update (``--log-format json --log-interval 1``) and end with bit-identical weights: the model,
optimizer, learning rate, data iterator position and random state are all restored. fairseq reseeds torch from
``--seed`` plus the update count before every update, so dropout repeats; fairseq's SpecAugment draws from numpy's
global generator, which no checkpoint holds, so its masks repeat only because the speech task draws every training
item under a seed of its own (``SeededItems``). The finished run started again trains no more and leaves its
checkpoint unchanged.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from fairseq.data import Dictionary
from fairseq.tokenizer import tokenize_line

from cli import BIN, REPO, run_ok
from test_fp16_decoding import prepare_fixture
from test_librispeech_recipe import TINY_MODEL

pytestmark = pytest.mark.slow


def per_update_log(out: str) -> dict[int, dict]:
    """fairseq's ``train_inner`` JSON records by update number."""
    records = [json.loads(r) for r in re.findall(r"\| train_inner \| (\{.*\})$", out, flags=re.M)]
    return {int(r["num_updates"]): r for r in records}


def assert_resume_repeats_the_run(command: list[str], work: Path, max_update: int, restart_at: int) -> None:
    """Train ``command`` to ``max_update`` without interruption and again from its checkpoint of update
    ``restart_at``, which must fall in mid-epoch; the losses after it and the final weights must be identical."""
    schedule = ["--max-update", str(max_update), "--save-interval-updates", str(restart_at), "--no-epoch-checkpoints",
                "--disable-validation", "--log-format", "json", "--log-interval", "1", "--num-workers", "0", "--cpu"]
    full = per_update_log(run_ok([*command, *schedule, "--save-dir", str(work / "full")]))
    assert sorted(full) == list(range(1, max_update + 1))
    assert full[restart_at]["epoch"] == full[restart_at + 1]["epoch"], "the restart must fall in mid-epoch"
    assert full[max_update]["epoch"] > full[restart_at]["epoch"], "the resumed run must reach the next epoch"
    (checkpoint,) = (work / "full").glob(f"checkpoint_*_{restart_at}.pt")
    (work / "resumed").mkdir()
    shutil.copy(checkpoint, work / "resumed/checkpoint_last.pt")
    resumed = per_update_log(run_ok([*command, *schedule, "--save-dir", str(work / "resumed")]))
    assert sorted(resumed) == list(range(restart_at + 1, max_update + 1))  # resumed, not restarted
    assert {n: resumed[n]["loss"] for n in resumed} == {n: full[n]["loss"] for n in resumed}
    weights = [torch.load(work / run / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
               for run in ("full", "resumed")]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    # the finished run started again: fairseq would take one more update before checking --max-update
    finished = (work / "full/checkpoint_last.pt").read_bytes()
    again = run_ok([*command, *schedule, "--save-dir", str(work / "full")])
    assert f"has done {max_update} updates, --max-update is {max_update}: nothing to train" in again, again[-2000:]
    assert not per_update_log(again) and (work / "full/checkpoint_last.pt").read_bytes() == finished


def test_transducer_resumes_exactly(tmp_path):
    """SpecAugment and dropout on, batches of one of the three training utterances: restart after update 2 of
    epoch 1, run to update 5."""
    data = prepare_fixture(tmp_path)
    assert "specaugment" in yaml.safe_load((data / "config.yaml").read_text())["feature_transforms"]["_train"]
    command = [str(BIN / "fairseq-train"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
               "--train-subset", "train-fixture", "--arch", "mssm_transducer", *TINY_MODEL.split(), "--dropout", "0.1",
               "--predictor-dropout", "0.3", "--criterion", "transducer", "--optimizer", "adam", "--lr", "1e-3",
               "--lr-scheduler", "warmup_hold_exp_decay", "--warmup-updates", "2", "--batch-size", "1",
               "--required-batch-size-multiple", "1"]
    assert_resume_repeats_the_run(command, tmp_path, max_update=5, restart_at=2)


def test_spade_lm_resumes_exactly(tmp_path):
    """Dropout on, the WikiText sample in blocks of 64 tokens, 16 blocks a batch (4 batches an epoch): restart after
    update 3 of epoch 1, run to update 6. The text is read as fairseq's raw dataset (no fairseq-preprocess)."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(REPO / "recipes/wikitext103/sample/wiki.train.tokens", data / "train")
    dictionary = Dictionary()
    Dictionary.add_file_to_dictionary(str(data / "train"), dictionary, tokenize_line, num_workers=1)
    dictionary.save(str(data / "dict.txt"))
    command = [str(BIN / "fairseq-train"), str(data), "--user-dir", "ssm_fairseq", "--task", "language_modeling",
               "--dataset-impl", "raw", "--arch", "spade_lm", "--decoder-layers", "2", "--decoder-embed-dim", "32",
               "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "4", "--attention-window", "8",
               "--ssm-state-size", "8", "--dropout", "0.3", "--tokens-per-sample", "64", "--sample-break-mode",
               "none", "--max-tokens", "1024", "--criterion", "cross_entropy", "--optimizer", "adam", "--lr", "1e-3",
               "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "2"]
    assert_resume_repeats_the_run(command, tmp_path, max_update=6, restart_at=3)
