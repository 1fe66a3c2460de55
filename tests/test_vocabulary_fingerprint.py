"""SentencePiece models are fingerprinted by what they encode and decode with
(``ssm_fairseq.integrity.vocabulary_fingerprint``):
a preparation repeated in another directory matches the first, a changed score or normalization does not, and the
byte digests of checkpoints saved before content digests still match."""
from __future__ import annotations

import logging
import struct
import sys
from pathlib import Path

import pytest

from librispeech_fixture import write_fixture
from ssm_fairseq.integrity.checkpoint_checks import config_differences, dictionary_fingerprint, fingerprint_differences
from ssm_fairseq.integrity.vocabulary_fingerprint import sentencepiece_content_sha256

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import prepare_librispeech  # noqa: E402

MODEL, DICTIONARY = "spm_unigram24.model", "spm_unigram24.txt"


@pytest.fixture(scope="module")
def preparations(tmp_path_factory) -> tuple[Path, Path]:
    """The fixture corpus prepared twice with the same options, into two directories."""
    root = tmp_path_factory.mktemp("vocabulary_fingerprint")
    corpus = write_fixture(root)
    for name in ("first", "second"):
        assert prepare_librispeech.main(["--librispeech-root", str(corpus), "--out", str(root / name), "--subsets",
                                         "train-fixture", "--vocab-size", "24", "--jobs", "1"]) == 0
    return root / "first", root / "second"


def fingerprint(data: Path) -> dict:
    return dictionary_fingerprint({"dictionary": data / DICTIONARY, "sentencepiece_model": data / MODEL})


def with_score(source: Path, target: Path, piece: str, score: float) -> Path:
    """``source`` with ``piece``'s score replaced (the serialized piece: its string, then its float32 score)."""
    data = bytearray(source.read_bytes())
    encoded = piece.encode("utf-8")
    at = data.index(b"\x0a" + bytes([len(encoded)]) + encoded + b"\x15") + len(encoded) + 3
    data[at:at + 4] = struct.pack("<f", score)
    target.write_bytes(data)
    return target


def test_the_same_preparation_elsewhere_has_other_bytes_and_the_same_content(preparations):
    first, second = preparations
    assert (first / MODEL).read_bytes() != (second / MODEL).read_bytes()  # it records where it was trained
    assert (first / DICTIONARY).read_bytes() == (second / DICTIONARY).read_bytes()
    assert sentencepiece_content_sha256(first / MODEL) == sentencepiece_content_sha256(second / MODEL)
    assert fingerprint(first)["sentencepiece_model"]["content_version"] == 1
    assert fingerprint_differences(fingerprint(first), fingerprint(second), "A", "B") == []
    # resuming (fairseq-train --restore-file) and averaging compare the stored fingerprints the same way
    assert config_differences({"dictionary_fingerprint": fingerprint(first)},
                              {"dictionary_fingerprint": fingerprint(second)}, "A", "B") == []


def test_a_changed_score_type_or_normalization_is_another_model(preparations, tmp_path):
    first, _ = preparations
    digest = sentencepiece_content_sha256(first / MODEL)
    assert sentencepiece_content_sha256(with_score(first / MODEL, tmp_path / "score.model", "th", -1.5)) != digest
    control, user_defined = b"<s>\x15\x00\x00\x00\x00\x18\x03", b"<s>\x15\x00\x00\x00\x00\x18\x04"  # <s>'s type
    for name, old, new in [("normalizer", b"nmt_nfkc", b"nfkc_cf\0"), ("type", control, user_defined)]:
        (tmp_path / f"{name}.model").write_bytes((first / MODEL).read_bytes().replace(old, new))
        assert sentencepiece_content_sha256(tmp_path / f"{name}.model") != digest, name
    (tmp_path / "copy").mkdir()
    copy = with_score(first / MODEL, tmp_path / "copy" / MODEL, "th", -1.5)
    other = fingerprint_differences(fingerprint(first), dictionary_fingerprint({"sentencepiece_model": copy}), "A",
                                    "B")
    assert other == [f"sentencepiece_model: {first / MODEL} (content sha256 {digest[:12]}) in A, {copy} (content "
                     f"sha256 {sentencepiece_content_sha256(copy)[:12]}) in B"]


def test_a_file_that_is_no_sentencepiece_model_is_named(preparations):
    first, _ = preparations
    with pytest.raises(ValueError, match=f"{first / DICTIONARY} is not a SentencePiece model"):
        sentencepiece_content_sha256(first / DICTIONARY)


def older(fingerprint: dict) -> dict:
    """``fingerprint`` as a release before content digests stored it: the files' bytes only."""
    return {role: {"file": record["file"], "sha256": record["sha256"]} for role, record in fingerprint.items()}


def test_a_fingerprint_saved_before_content_digests_compares_bytes(preparations, tmp_path, caplog):
    """The same file matches by its bytes; a model prepared again elsewhere (other bytes) with the same dictionary
    is accepted with a warning; another dictionary is refused as before."""
    first, second = preparations
    with caplog.at_level(logging.WARNING):
        assert fingerprint_differences(older(fingerprint(first)), fingerprint(first), "A", "B") == []
        assert not caplog.records
        assert fingerprint_differences(older(fingerprint(first)), fingerprint(second), "A", "B") == []
    assert f"sentencepiece_model: {first / MODEL} (sha256 " in caplog.text
    assert "recorded by its bytes (saved by an earlier version)" in caplog.text
    assert "the dictionary of units is the same, so it is accepted" in caplog.text
    lines = (second / DICTIONARY).read_text().splitlines(keepends=True)
    (second / DICTIONARY).write_text("".join([lines[1], lines[0], *lines[2:]]))
    try:
        differences = fingerprint_differences(older(fingerprint(first)), fingerprint(second), "A", "B")
    finally:
        (second / DICTIONARY).write_text("".join(lines))
    assert [d.split(":")[0] for d in differences] == ["dictionary", "sentencepiece_model"]
