"""Manifests are checked when a split is loaded: every bad row is named by file, line and utterance."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from ssm_fairseq.integrity.manifest_check import check_manifest

HEADER = "id\taudio\tn_frames\ttgt_text\tspeaker\n"


def write_split(root: Path, rows: list[str], audio_root: Path | str | None = None) -> None:
    """``root/dev.tsv`` with ``rows``, ``root/config.yaml`` whose ``audio_root`` is ``audio_root`` (default:
    ``root``), and feature files under ``root/fbank80``."""
    (root / "fbank80").mkdir(parents=True, exist_ok=True)
    for name, frames, width in (("a", 7, 80), ("b", 5, 80), ("narrow", 5, 40)):
        np.save(root / "fbank80" / f"{name}.npy", np.zeros((frames, width), dtype=np.float32))
    (root / "dev.tsv").write_text(HEADER + "".join(row + "\n" for row in rows), encoding="utf-8")
    config = {"input_feat_per_channel": 80, "audio_root": str(root if audio_root is None else audio_root)}
    (root / "config.yaml").write_text(yaml.safe_dump(config))


GOOD = ["utt-a\tfbank80/a.npy\t7\tthe cat\t19", "utt-b\tfbank80/b.npy\t5\ta \"dog\"\t26"]


def test_a_good_manifest_counts_its_utterances(tmp_path):
    write_split(tmp_path, GOOD)
    assert check_manifest(tmp_path, "dev", 80) == 2


@pytest.mark.parametrize("bad_row,message", [
    ("utt-c\tfbank80/a.npy\t7\tthe cat", "expected 5 tab-separated columns"),
    ("utt-c\tfbank80/a.npy\t7\tthe cat\t19\textra", "expected 5 tab-separated columns"),
    ("utt-c\tfbank80/missing.npy\t7\tthe cat\t19", "fbank80/missing.npy does not exist"),
    ("utt-c\tfbank80/narrow.npy\t5\tthe cat\t19", "shape (5, 40); config.yaml says input_feat_per_channel: 80"),
    ("utt-c\tfbank80/a.npy\t9\tthe cat\t19", "n_frames is 9 but"),
    ("utt-c\tfbank80/a.npy\tseven\tthe cat\t19", "n_frames must be a positive integer, got 'seven'"),
])
def test_a_bad_row_is_named_by_line_and_utterance(tmp_path, bad_row, message):
    write_split(tmp_path, GOOD + [bad_row])
    with pytest.raises(ValueError, match=rf"dev.tsv:4: utterance 'utt-c': .*{message.replace('(', '.').replace(')', '.')}"):
        check_manifest(tmp_path, "dev", 80)


def test_a_corrupt_feature_file_and_an_empty_manifest_are_named(tmp_path):
    write_split(tmp_path, GOOD)
    (tmp_path / "fbank80/b.npy").write_bytes(b"cut short")
    with pytest.raises(ValueError, match=r"dev.tsv:3: utterance 'utt-b': .*b.npy is not a readable .npy file"):
        check_manifest(tmp_path, "dev", 80)
    write_split(tmp_path, [])
    with pytest.raises(ValueError, match="dev.tsv: no utterances"):
        check_manifest(tmp_path, "dev", 80)


def fairseq_reads_every_row(root: Path) -> None:
    """Load every row's features as fairseq's ``speech_to_text`` dataset does (raises if a path is wrong)."""
    from fairseq.data import Dictionary
    from fairseq.data.audio.data_cfg import S2TDataConfig
    from fairseq.data.audio.speech_to_text_dataset import SpeechToTextDatasetCreator

    config = S2TDataConfig(root / "config.yaml")
    dataset = SpeechToTextDatasetCreator.from_tsv(str(root), config, "dev", Dictionary(), None, None,
                                                  is_train_split=False, epoch=1, seed=1)
    for index in range(len(dataset)):
        dataset[index]


def test_feature_paths_are_resolved_against_configs_audio_root_as_fairseq_does(tmp_path, monkeypatch):
    features, data = tmp_path / "features", tmp_path / "data"
    write_split(features, GOOD)  # the features live elsewhere; config.yaml's audio_root says where
    data.mkdir()
    (features / "dev.tsv").replace(data / "dev.tsv")
    (data / "config.yaml").write_text(yaml.safe_dump({"input_feat_per_channel": 80, "audio_root": str(features)}))
    assert check_manifest(data, "dev", 80) == 2
    fairseq_reads_every_row(data)
    # an empty audio_root: relative paths are relative to the working directory, as fairseq opens them
    (data / "config.yaml").write_text(yaml.safe_dump({"input_feat_per_channel": 80, "audio_root": ""}))
    monkeypatch.chdir(features)
    assert check_manifest(data, "dev", 80) == 2
    fairseq_reads_every_row(data)
    monkeypatch.chdir(data)
    with pytest.raises(ValueError, match=r"dev.tsv:2: utterance 'utt-a': feature file fbank80/a.npy does not exist"):
        check_manifest(data, "dev", 80)


def test_a_moved_data_directory_reads_the_features_beside_its_config(tmp_path, caplog):
    """``config.yaml``'s ``audio_root`` is read relative to the data directory (``.``, as ``ssm-prepare-librispeech``
    writes it, from any working directory); an absolute one that no longer exists (a directory prepared by an earlier
    release, then moved) falls back to the data directory, with a warning. fairseq's own config reads neither."""
    from ssm_fairseq.asr.transducer.data_config import DataDirectoryConfig

    relative = tmp_path / "relative"
    write_split(relative, GOOD, audio_root=".")
    assert DataDirectoryConfig(relative / "config.yaml").audio_root == str(relative)
    assert check_manifest(relative, "dev", 80) == 2
    moved = tmp_path / "moved"
    write_split(moved, GOOD, audio_root=tmp_path / "where-it-was")  # features beside the manifest, config stale
    assert check_manifest(moved, "dev", 80) == 2
    assert (f"{moved}/config.yaml names {tmp_path}/where-it-was, which does not exist (the data directory was "
            f"prepared elsewhere and moved?): reading {moved} instead") in caplog.text
    with pytest.raises(FileNotFoundError):
        fairseq_reads_every_row(moved)  # what fairseq's S2TDataConfig does with it: fail at the first batch


def test_a_feature_file_shorter_than_its_header_says_is_named(tmp_path):
    write_split(tmp_path, GOOD)
    full = (tmp_path / "fbank80/a.npy").read_bytes()
    (tmp_path / "fbank80/a.npy").write_bytes(full[:-4])  # header intact, the last value cut off
    with pytest.raises(ValueError, match=r"dev.tsv:2: utterance 'utt-a': .*a.npy is not a readable .npy file "
                                         r"\(\d+ bytes where its header promises \d+\)"):
        check_manifest(tmp_path, "dev", 80)
