"""Manifests are checked when a split is loaded: every bad row is named by file, line and utterance."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ssm_fairseq.tasks.manifest_check import check_manifest

HEADER = "id\taudio\tn_frames\ttgt_text\tspeaker\n"


def write_split(root: Path, rows: list[str]) -> None:
    (root / "fbank80").mkdir(parents=True, exist_ok=True)
    for name, frames, width in (("a", 7, 80), ("b", 5, 80), ("narrow", 5, 40)):
        np.save(root / "fbank80" / f"{name}.npy", np.zeros((frames, width), dtype=np.float32))
    (root / "dev.tsv").write_text(HEADER + "".join(row + "\n" for row in rows), encoding="utf-8")


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
