"""Bad inputs stop by name or are left out by name, never a silent wrong number or a nameless crash.

Features with NaN or inf (the criterion drops the utterance in training and validation, decoding stops naming
it), a truncated checkpoint (the error names its path) and a model of another family given to the speech task
(one line naming the model and task expected and found).
"""
from __future__ import annotations

import logging
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from cli import BIN, REPO, run_ok
from librispeech_fixture import write_fixture
from test_librispeech_recipe import TINY_MODEL, _recipe_env
from ssm_fairseq.integrity.feature_check import non_finite_utterances
from transducer_cases import SMALL, build, random_sample

pytestmark = pytest.mark.slow


def test_only_frames_within_an_utterance_s_length_count():
    features = torch.zeros(3, 5, 2)
    features[0, 4, 1] = float("nan")  # padding of a 4-frame utterance
    features[1, 2, 0] = float("-inf")
    assert non_finite_utterances(features, torch.tensor([4, 5, 5])).tolist() == [False, True, False]


def _without(sample: dict, drop: int) -> dict:
    """``sample`` less utterance ``drop`` (features trimmed to the longest one left)."""
    keep = torch.tensor([i for i in range(len(sample["id"])) if i != drop])
    lengths = sample["net_input"]["src_lengths"][keep]
    return {
        "id": sample["id"][keep],
        "net_input": {"src_tokens": sample["net_input"]["src_tokens"][keep, :int(lengths.max())],
                      "src_lengths": lengths},
        "target": sample["target"][keep],
        "target_lengths": sample["target_lengths"][keep],
    }


@pytest.mark.parametrize("criterion_args", [("--aux-ctc-every", "1"), ("--rnnt-loss", "pruned")])
@pytest.mark.parametrize("bad_value", [float("nan"), float("inf")])
def test_an_utterance_with_non_finite_features_is_dropped_by_name(caplog, criterion_args, bad_value):
    model, criterion, _, task = build("mssm_transducer", *SMALL, *criterion_args)
    sample = random_sample(task, [41, 60, 30], [4, 6, 3])
    sample["net_input"]["src_tokens"][1, 17, 5] = bad_value
    with caplog.at_level(logging.WARNING):
        loss, sample_size, log = criterion(model, sample)
    assert log["dropped"] == 1 and log["nsentences"] == 2 and sample_size == 4 + 3
    assert "dropped utterance id=1 from this step: features are not finite" in caplog.text
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    model.eval()  # no dropout: the other utterances score as they do in a batch without the bad one
    with torch.no_grad():
        loss = criterion(model, sample)[0]
        clean = criterion(model, _without(sample, 1))[0]
    assert torch.allclose(loss, clean, rtol=1e-5)


# the utterances made non-finite, and their sample ids (rows of their manifests)
NAN_UTTERANCE, NAN_ID = "19-198-0000", 0
INF_UTTERANCE, INF_ID = "26-496-0000", 1


@pytest.fixture(scope="module")
def corrupted(tmp_path_factory) -> tuple[Path, str, Path]:
    """The fixture corpus prepared by the recipe (stage 1), with one training utterance all NaN and one frame of a
    test utterance inf, and ``fairseq-train`` run on it for an epoch: ``(data, training output, checkpoint)``."""
    root = tmp_path_factory.mktemp("bad_inputs")
    work = root / "work"
    run_ok(["bash", "recipes/librispeech/run.sh", "--conf", "recipes/librispeech/conf/mini.sh", "--stop-stage", "1"],
           env=_recipe_env(write_fixture(root), work))
    data = work / "data"
    for split, utterance, frames in (("train-fixture", NAN_UTTERANCE, slice(None)), ("test-fixture", INF_UTTERANCE, 3)):
        path = data / "fbank80" / split / f"{utterance}.npy"
        features = np.load(path)
        features[frames] = np.nan if split == "train-fixture" else np.inf
        np.save(path, features)
    out = run_ok([str(BIN / "fairseq-train"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
                  "--train-subset", "train-fixture", "--valid-subset", "test-fixture", "--arch", "mssm_transducer",
                  *TINY_MODEL.split(), "--encoder-layers", "2", "--aux-ctc-every", "1", "--criterion", "transducer",
                  "--optimizer", "adam",
                  "--lr", "1e-3", "--max-epoch", "1", "--batch-size", "3", "--save-dir", str(root / "ckpt"),
                  "--num-workers", "0", "--cpu", "--log-format", "simple", "--log-interval", "1"])
    return data, out, root / "ckpt/checkpoint_last.pt"


def test_fairseq_train_drops_non_finite_utterances_and_trains_to_the_end(corrupted):
    _, out, checkpoint = corrupted
    assert "done training" in out and checkpoint.exists()
    for sample_id in (NAN_ID, INF_ID):  # training, validation
        assert f"dropped utterance id={sample_id} from this step: features are not finite (NaN or inf)" in out
    epochs = re.findall(r"\| train \| epoch (\d+) \| loss ([0-9.]+) .*\| dropped 1 \| nsentences 2 ", out)
    assert [epoch for epoch, _ in epochs] == ["001"]
    valid = re.findall(r"valid on 'test-fixture' subset \| loss ([0-9.]+) .*\| dropped 1 \| nsentences 1 ", out)
    assert len(valid) == 1
    assert all(math.isfinite(float(loss)) for loss in [*valid, *(loss for _, loss in epochs)])


def test_fairseq_generate_stops_naming_the_non_finite_utterance(corrupted, tmp_path):
    data, _, checkpoint = corrupted
    result = subprocess.run([str(BIN / "fairseq-generate"), str(data), "--user-dir", "ssm_fairseq", "--task",
                             "speech_transducer", "--path", str(checkpoint), "--gen-subset", "test-fixture",
                             "--beam", "2", "--scoring", "wer", "--max-tokens", "10000", "--cpu"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode != 0 and "WER" not in result.stdout
    assert (f"ValueError: {data}/test-fixture.tsv: utterance '{INF_UTTERANCE}' (sample id {INF_ID}): features are "
            "not finite (NaN or inf)") in result.stderr


def _truncated_checkpoint_commands(data: Path, checkpoint: Path, tmp_path: Path) -> dict[str, list[str]]:
    lm_data = tmp_path / "lm"
    lm_data.mkdir()
    shutil.copy(data / "spm_unigram24.txt", lm_data / "dict.txt")  # all that eval-lm's task reads before --path
    return {
        "generate": [str(BIN / "fairseq-generate"), str(data), "--user-dir", "ssm_fairseq", "--task",
                     "speech_transducer", "--path", str(checkpoint), "--gen-subset", "train-fixture",
                     "--max-tokens", "10000", "--cpu"],
        "eval-lm": [str(BIN / "fairseq-eval-lm"), str(lm_data), "--user-dir", "ssm_fairseq", "--path",
                    str(checkpoint), "--cpu"],
        "train": [str(BIN / "fairseq-train"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
                  "--train-subset", "train-fixture", "--valid-subset", "test-fixture", "--arch", "mssm_transducer",
                  *TINY_MODEL.split(), "--criterion", "transducer", "--optimizer", "adam", "--lr", "1e-3",
                  "--max-update", "1", "--batch-size", "2", "--restore-file", str(checkpoint), "--save-dir",
                  str(tmp_path / "ckpt"), "--num-workers", "0", "--cpu"],
    }


@pytest.mark.parametrize("command", ["generate", "eval-lm", "train"])
def test_a_truncated_checkpoint_is_named(corrupted, tmp_path, command):
    data, _, checkpoint = corrupted
    truncated = tmp_path / "truncated.pt"
    whole = checkpoint.read_bytes()
    truncated.write_bytes(whole[:len(whole) // 2])
    result = subprocess.run(_truncated_checkpoint_commands(data, truncated, tmp_path)[command],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode != 0
    assert (f"RuntimeError: checkpoint {truncated} is truncated or not a checkpoint: PytorchStreamReader failed "
            "reading zip archive") in result.stderr.splitlines()[-1]
