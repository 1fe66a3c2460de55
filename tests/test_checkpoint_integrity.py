"""Checkpoints are checked before anything uses them (``ssm_fairseq.integrity.checkpoint_checks``).

Damaged bytes (the zip's CRC), NaN weights, a dictionary other than the one trained with, features other than those
trained on (CMVN, global CMVN statistics) and a resumed run with other architecture flags each stop
``fairseq-generate``, ``fairseq-train --restore-file`` and ``ssm_fairseq.transcribe`` in one line naming the
checkpoint; a plain resume and a changed dropout still train. The models: TINY_MODEL trained two epochs (one update
each) on the five-utterance fixture (utterance CMVN), and one epoch on the fixture prepared with ``--cmvn global``.
"""
from __future__ import annotations

import hashlib
import logging
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ssm_fairseq.integrity.checkpoint_checks import CheckpointError, DictionaryMismatchError, FeatureMismatchError, \
    config_differences, first_non_finite_parameter
from ssm_fairseq.transcribe import Transcriber

from cli import BIN, REPO, run_ok
from test_fp16_decoding import prepare_fixture
from test_librispeech_recipe import TINY_MODEL

pytestmark = pytest.mark.slow

TRAIN = ["--user-dir", "ssm_fairseq", "--task", "speech_transducer", "--train-subset", "train-fixture", "--arch",
         "mssm_transducer", *TINY_MODEL.split(), "--ssm-gating", "ihg", "--criterion", "transducer", "--optimizer",
         "adam", "--lr", "1e-3", "--batch-size", "3", "--disable-validation", "--num-workers", "0", "--cpu"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """``(data directory, checkpoint directory)``: ``checkpoint1.pt``, ``checkpoint2.pt``, ``checkpoint_last.pt``."""
    root = tmp_path_factory.mktemp("checkpoint_integrity")
    data = prepare_fixture(root, "--no-specaugment")
    run_ok([str(BIN / "fairseq-train"), str(data), *TRAIN, "--max-epoch", "2", "--save-dir", str(root / "ckpt")])
    return data, root / "ckpt"


@pytest.fixture(scope="module")
def trained_global(tmp_path_factory) -> tuple[Path, Path]:
    """``(data directory, checkpoint_last.pt)``: the fixture prepared with ``--cmvn global`` (``gcmvn.npz``), one
    epoch."""
    root = tmp_path_factory.mktemp("checkpoint_integrity_global")
    data = prepare_fixture(root, "--no-specaugment", "--cmvn", "global")
    run_ok([str(BIN / "fairseq-train"), str(data), *TRAIN, "--max-epoch", "1", "--save-dir", str(root / "ckpt")])
    return data, root / "ckpt/checkpoint_last.pt"


def audio_files(data: Path) -> list[Path]:
    """The fixture's test FLAC files (``prepare_fixture`` writes the corpus beside the data directory)."""
    return sorted((data.parent / "LibriSpeech/test-fixture").glob("*/*/*.flac"))


def damage_a_tensor(source: Path, target: Path) -> str:
    """Copy ``source`` to ``target`` with one bit flipped in the middle of its largest tensor's data (the zip
    directory intact): the name of that zip member."""
    data = bytearray(source.read_bytes())
    with zipfile.ZipFile(source) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + name_length + extra_length + info.file_size // 2] ^= 0x04
    target.write_bytes(data)
    return info.filename


def edited(source: Path, target: Path, edit) -> Path:
    """``source``'s state after ``edit(state)``, saved at ``target``."""
    state = torch.load(source, map_location="cpu", weights_only=False)
    edit(state)
    torch.save(state, target)
    return target


def copy_with_config(data: Path, target: Path, edit) -> Path:
    """A copy of data directory ``data`` at ``target`` whose ``config.yaml`` is changed by ``edit(config)``."""
    shutil.copytree(data, target)
    config = yaml.safe_load((target / "config.yaml").read_text())
    edit(config)
    (target / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def use_cmvn(config: dict, stats: Path | None) -> None:
    """Switch ``config`` to global CMVN with the statistics at ``stats``, or to utterance CMVN (``stats`` None), as
    ``prepare_librispeech.py --cmvn global|utterance`` writes it."""
    cmvn = "utterance_cmvn" if stats is None else "global_cmvn"
    config["feature_transforms"] = {"_train": [cmvn], "*": [cmvn]}
    config.pop("global_cmvn", None)
    if stats is not None:
        config["global_cmvn"] = {"stats_npz_path": str(stats)}


def write_stats(path: Path, shift: float = 0.0) -> Path:
    """Global CMVN statistics (80 means and stds) at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, mean=np.full(80, 10.0 + shift, dtype=np.float32), std=np.full(80, 3.0, dtype=np.float32))
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def generate(data: Path, checkpoint: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "fairseq-generate"), str(data), "--user-dir", "ssm_fairseq", "--task",
                           "speech_transducer", "--path", str(checkpoint), "--gen-subset", "test-fixture", "--beam",
                           "2", "--scoring", "wer", "--cpu", *flags], capture_output=True, text=True, cwd=REPO)


def resume(data: Path, checkpoint: Path, save_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "fairseq-train"), str(data), *TRAIN, *flags, "--max-epoch", "3",
                           "--restore-file", str(checkpoint), "--save-dir", str(save_dir)],
                          capture_output=True, text=True, cwd=REPO)


@pytest.mark.parametrize("command", ["generate", "train", "transcribe"])
def test_flipped_bytes_in_a_tensor_are_named(trained, tmp_path, command):
    data, checkpoints = trained
    damaged = tmp_path / "damaged.pt"
    member = damage_a_tensor(checkpoints / "checkpoint_last.pt", damaged)
    message = f"checkpoint {damaged} is corrupted: member {member} fails its CRC check"
    if command == "transcribe":
        with pytest.raises(CheckpointError, match=message):
            Transcriber(damaged, device="cpu")
        return
    result = (generate(data, damaged, "--max-tokens", "10000") if command == "generate"
              else resume(data, damaged, tmp_path / "resumed"))
    assert result.returncode != 0 and "WER" not in result.stdout
    assert message in result.stderr.splitlines()[-1]


def test_non_finite_weights_are_refused_naming_the_parameter(trained, tmp_path):
    data, checkpoints = trained
    state = torch.load(checkpoints / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    name = next(n for n, value in state["model"].items() if value.is_floating_point() and value.numel() > 1)
    size = state["model"][name].numel()

    def poison(state):
        state["model"][name].view(-1)[1] = float("nan")

    bad = edited(checkpoints / "checkpoint_last.pt", tmp_path / "nan.pt", poison)
    message = f"checkpoint {bad} has non-finite weights: parameter {name} (1 of {size} values NaN or inf)"
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Transcriber(bad, device="cpu")
    out = subprocess.run([sys.executable, "-m", "ssm_fairseq.transcribe", "--checkpoint", str(bad),
                          "--cpu", *map(str, audio_files(data))], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 1 and out.stdout == "" and message in out.stderr
    assert "hypothesis scores are not finite" not in out.stderr


def test_fairseqs_uninitialised_placeholders_are_not_weights():
    """Adaptive input and softmax keep a ``_float_tensor = torch.FloatTensor(1)`` of uninitialised memory for its
    dtype: NaN there by chance is no damage (it failed a WikiText-103 recipe run once)."""
    state = {"decoder.embed_tokens._float_tensor": torch.tensor([float("nan")]), "decoder.weight": torch.ones(2)}
    assert first_non_finite_parameter(state) is None
    state["decoder.weight"][0] = float("inf")
    assert first_non_finite_parameter(state) == "decoder.weight (1 of 2 values NaN or inf)"


def test_a_changed_dictionary_is_refused_naming_both(trained, tmp_path):
    """prepare_librispeech.py run again into the data directory with other subsets writes another dictionary;
    here the dictionary's first two units trade places (the same units, other label ids)."""
    data, checkpoints = trained
    checkpoint = checkpoints / "checkpoint_last.pt"
    stored = torch.load(checkpoint, map_location="cpu", weights_only=False)["cfg"]["model"]
    assert stored["dictionary_fingerprint"]["dictionary"]["file"] == str(data / "spm_unigram24.txt")
    other = tmp_path / "other"
    shutil.copytree(data, other)
    lines = (other / "spm_unigram24.txt").read_text().splitlines(keepends=True)
    (other / "spm_unigram24.txt").write_text("".join([lines[1], lines[0], *lines[2:]]))
    expected = (f"checkpoint {checkpoint}: trained with other dictionary files than {other}'s, so its labels would "
                f"decode to other units: dictionary: {data}/spm_unigram24.txt (sha256 ")
    result = generate(other, checkpoint, "--max-tokens", "10000")
    assert result.returncode != 0 and "WER" not in result.stdout
    assert expected in result.stderr.splitlines()[-1] and f"{other}/spm_unigram24.txt (sha256 " in result.stderr
    with pytest.raises(DictionaryMismatchError) as error:
        Transcriber(checkpoint, data_dir=other, device="cpu")
    assert str(error.value).startswith(expected)
    assert Transcriber(checkpoint, data_dir=data, device="cpu").transcribe(audio_files(data)[:1])  # its own: fine


def test_a_checkpoint_without_fingerprint_is_accepted_with_a_warning(trained, tmp_path, caplog):
    data, checkpoints = trained
    old = edited(checkpoints / "checkpoint_last.pt", tmp_path / "old.pt",
                 lambda state: state["cfg"]["model"].pop("dictionary_fingerprint"))
    with caplog.at_level(logging.WARNING):
        Transcriber(old, device="cpu")
    assert "the checkpoint records no dictionary fingerprint (saved by an earlier version)" in caplog.text
    assert "the checkpoint records no feature fingerprint (saved by an earlier version)" in caplog.text


FEATURE_MISMATCH = ("trained on other features than {config} gives, so its transcripts would be garbage: {what}. "
                    "Decode with the data directory it was trained on")


def test_a_model_trained_on_utterance_cmvn_is_refused_on_global_cmvn(trained, tmp_path):
    """A data directory switched to global CMVN (``prepare_librispeech.py --cmvn global --overwrite-cmvn``, or
    ``--data-dir`` pointing at a directory prepared for streaming): the model would get features normalised
    otherwise than in training, and transcribe garbage."""
    data, checkpoints = trained
    checkpoint = checkpoints / "checkpoint_last.pt"
    stats = write_stats(tmp_path / "gcmvn.npz")
    other = copy_with_config(data, tmp_path / "global", lambda config: use_cmvn(config, stats))
    expected = FEATURE_MISMATCH.format(config=f"{other}/config.yaml", what=(
        f"feature transforms: utterance CMVN in the checkpoint (at training), global CMVN from {stats} in this data "
        f"directory"))
    with pytest.raises(FeatureMismatchError) as error:
        Transcriber(checkpoint, data_dir=other, device="cpu")
    assert str(error.value) == f"checkpoint {checkpoint}: {expected}"
    result = generate(other, checkpoint, "--max-tokens", "10000")
    assert result.returncode != 0 and "WER" not in result.stdout
    assert f"checkpoint {checkpoint}: {expected}" in result.stderr.splitlines()[-1]


def test_a_model_trained_on_global_cmvn_is_refused_on_utterance_cmvn(trained_global, tmp_path):
    data, checkpoint = trained_global
    other = copy_with_config(data, tmp_path / "utterance", lambda config: use_cmvn(config, None))
    with pytest.raises(FeatureMismatchError) as error:
        Transcriber(checkpoint, data_dir=other, device="cpu")
    assert str(error.value) == f"checkpoint {checkpoint}: " + FEATURE_MISMATCH.format(
        config=f"{other}/config.yaml", what=f"feature transforms: global CMVN from {data}/gcmvn.npz in the checkpoint "
                                            f"(at training), utterance CMVN in this data directory")


def test_other_global_cmvn_statistics_are_refused_naming_both(trained_global, tmp_path):
    """``prepare_librispeech.py --cmvn global`` run again on other training audio replaces ``gcmvn.npz``."""
    data, checkpoint = trained_global
    stats = write_stats(tmp_path / "other/gcmvn.npz", shift=1.0)
    other = copy_with_config(data, tmp_path / "copy", lambda config: use_cmvn(config, stats))
    with pytest.raises(FeatureMismatchError) as error:
        Transcriber(checkpoint, data_dir=other, device="cpu")
    assert str(error.value) == f"checkpoint {checkpoint}: " + FEATURE_MISMATCH.format(
        config=f"{other}/config.yaml", what=(
            f"global CMVN statistics: {data}/gcmvn.npz (sha256 {sha256(data / 'gcmvn.npz')[:12]}) in the checkpoint "
            f"(at training), {stats} (sha256 {sha256(stats)[:12]}) in this data directory"))


def test_the_same_global_cmvn_statistics_at_another_path_are_accepted(trained_global, tmp_path, caplog):
    """Statistics are compared by content: a data directory moved or copied elsewhere decodes."""
    data, checkpoint = trained_global
    stored = torch.load(checkpoint, map_location="cpu", weights_only=False)["cfg"]["model"]["dictionary_fingerprint"]
    assert stored["features"] == {"input_feat_per_channel": 80, "transforms": [
        {"name": "global_cmvn", "file": str(data / "gcmvn.npz"), "sha256": sha256(data / "gcmvn.npz")}]}
    moved = tmp_path / "elsewhere/statistics.npz"
    moved.parent.mkdir()
    shutil.copy(data / "gcmvn.npz", moved)
    other = copy_with_config(data, tmp_path / "copy", lambda config: use_cmvn(config, moved))
    with caplog.at_level(logging.WARNING):
        transcriber = Transcriber(checkpoint, data_dir=other, device="cpu")
    assert "fingerprint" not in caplog.text
    assert str(moved) in repr(transcriber.feature_transforms)  # it reads the moved file
    assert len(transcriber.transcribe(audio_files(data)[:1])) == 1


def test_a_checkpoint_without_feature_fingerprint_is_accepted_with_a_warning(trained_global, tmp_path, caplog):
    """A checkpoint saved before features were recorded: its features cannot be checked, so it decodes (here on
    utterance CMVN, which a current checkpoint would be refused) with a warning."""
    data, checkpoint = trained_global
    old = edited(checkpoint, tmp_path / "old.pt",
                 lambda state: state["cfg"]["model"]["dictionary_fingerprint"].pop("features"))
    other = copy_with_config(data, tmp_path / "utterance", lambda config: use_cmvn(config, None))
    with caplog.at_level(logging.WARNING):
        Transcriber(old, data_dir=other, device="cpu")
    assert (f"the checkpoint records no feature fingerprint (saved by an earlier version): cannot check that it was "
            f"trained on the features of {other} (feature transforms, CMVN statistics)") in caplog.text
    assert "dictionary fingerprint" not in caplog.text


def test_averaging_and_resuming_compare_features_by_content(tmp_path):
    """``config_differences`` (``average_checkpoints.py``, ``fairseq-train --restore-file``) names feature
    differences; statistics at another path with the same content are none."""
    features = {"input_feat_per_channel": 80, "transforms": [{"name": "global_cmvn", "file": "/a/gcmvn.npz",
                                                              "sha256": "ab" * 32}]}
    moved = {**features, "transforms": [{**features["transforms"][0], "file": "/b/gcmvn.npz"}]}
    other = {**features, "transforms": [{**features["transforms"][0], "sha256": "cd" * 32}]}
    utterance = {"input_feat_per_channel": 80, "transforms": [{"name": "utterance_cmvn"}]}

    def model(features):
        return {"dictionary_fingerprint": {"features": features}}

    assert config_differences(model(features), model(moved), "A", "B") == []
    assert config_differences(model(features), model(other), "A", "B") == [
        f"global CMVN statistics: /a/gcmvn.npz (sha256 {'ab' * 6}) in A, /a/gcmvn.npz (sha256 {'cd' * 6}) in B"]
    assert config_differences(model(features), model(utterance), "A", "B") == [
        "feature transforms: global CMVN from /a/gcmvn.npz in A, utterance CMVN in B"]
    assert config_differences(model(utterance), model({**utterance, "input_feat_per_channel": 40}), "A", "B") == [
        "input_feat_per_channel: 80 in A, 40 in B"]
    assert config_differences(model(features), {"dictionary_fingerprint": {}}, "A", "B") == []  # an older one


def test_a_field_that_an_earlier_release_lacked_compares_as_its_default():
    """A checkpoint saved before ``--causal-encoder`` existed has no such field: it resumes and averages with a
    run that leaves the field at its default, not with one that sets it."""
    older = {"_name": "mssm_transducer", "encoder_layers": 4}
    assert config_differences(older, {**older, "causal_encoder": False}, "A", "B") == []
    assert config_differences(older, {**older, "causal_encoder": True}, "A", "B") == [
        "causal_encoder: False in A, True in B"]
    assert config_differences({"_name": "no_such_arch", "x": 1}, {"_name": "no_such_arch"}, "A", "B") == [
        "x: 1 in A, (absent) in B"]  # no dataclass to ask: absent is a difference


def test_resuming_with_other_architecture_flags_is_refused_and_dropout_may_change(trained, tmp_path):
    """``--ssm-gating glu`` on an ``ihg`` checkpoint keeps every shape: fairseq would train on from it."""
    data, checkpoints = trained
    checkpoint = checkpoints / "checkpoint_last.pt"
    result = resume(data, checkpoint, tmp_path / "glu", "--ssm-gating", "glu")
    assert result.returncode != 0 and "done training" not in result.stdout + result.stderr
    assert (f"checkpoint {checkpoint} holds another model than this run's flags describe: ssm_gating: 'ihg' in "
            f"the checkpoint, 'glu' in this run. Resume with") in result.stderr.splitlines()[-1]
    result = resume(data, checkpoint, tmp_path / "dropout", "--dropout", "0.3")  # later flags win
    assert result.returncode == 0 and "done training" in result.stdout + result.stderr, result.stderr[-3000:]


def test_max_tokens_below_an_utterance_names_it(trained):
    data, checkpoints = trained
    result = generate(data, checkpoints / "checkpoint_last.pt", "--max-tokens", "30")
    assert result.returncode != 0
    assert result.stderr.splitlines()[-1] == (
        f"ValueError: {data}/test-fixture.tsv: utterance '19-227-0000' (sample id 0): 58 frames, more than "
        f"--max-tokens 30 lets into a batch (2 utterance(s) of the split are longer): raise --max-tokens to at "
        f"least 58")
