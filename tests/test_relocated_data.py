"""A data directory travels: moved whole, or prepared again elsewhere from the same corpus with the same options, it
decodes a model trained on it through ``fairseq-generate``, ``ssm_fairseq.transcribe`` and resumed training.

The model: TINY_MODEL trained one epoch on the five-utterance fixture prepared with ``--cmvn global`` (the
statistics in ``gcmvn.npz``); after training, the data directory is moved (``shutil.move``), so the path it was
trained at no longer exists.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import yaml

from ssm_fairseq.integrity.checkpoint_checks import DictionaryMismatchError
from ssm_fairseq.transcribe import Transcriber

from cli import BIN, run_ok
from test_checkpoint_integrity import TRAIN, audio_files, edited, generate, resume
from test_fp16_decoding import prepare_fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moved(tmp_path_factory) -> tuple[Path, Path]:
    """``(data directory, checkpoint_last.pt)``: trained at ``ROOT/data``, then moved to ``ROOT/moved/data``."""
    root = tmp_path_factory.mktemp("relocated_data")
    data = prepare_fixture(root, "--no-specaugment", "--cmvn", "global")
    run_ok([str(BIN / "fairseq-train"), str(data), *TRAIN, "--max-epoch", "1", "--save-dir", str(root / "ckpt")])
    (root / "moved").mkdir()
    return Path(shutil.move(data, root / "moved/data")), root / "ckpt/checkpoint_last.pt"


def test_a_moved_global_cmvn_directory_decodes(moved):
    data, checkpoint = moved
    result = generate(data, checkpoint, "--max-tokens", "10000")
    assert result.returncode == 0 and "WER" in result.stdout + result.stderr, result.stderr[-3000:]
    transcriber = Transcriber(checkpoint, data_dir=data, device="cpu")
    assert str(data / "gcmvn.npz") in repr(transcriber.feature_transforms)
    assert len(transcriber.transcribe(audio_files(data.parents[1] / "data")[:2])) == 2  # the corpus did not move


def with_absolute_paths(source: Path, target: Path) -> Path:
    """A copy of ``source`` whose ``config.yaml`` names its features and statistics by absolute paths into the copy,
    as an earlier release wrote it."""
    shutil.copytree(source, target)
    config = yaml.safe_load((target / "config.yaml").read_text())
    config.update(audio_root=str(target), global_cmvn={"stats_npz_path": str(target / "gcmvn.npz")})
    (target / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def test_a_directory_of_an_earlier_release_decodes_when_moved_and_names_missing_statistics(moved, tmp_path, caplog):
    """Its absolute paths no longer exist: the features and statistics beside ``config.yaml`` are read, with a
    warning; without the statistics, the error names them and what to do."""
    data, checkpoint = moved
    older = Path(shutil.move(with_absolute_paths(data, tmp_path / "older"), tmp_path / "elsewhere"))
    with caplog.at_level(logging.WARNING):
        transcriber = Transcriber(checkpoint, data_dir=older, device="cpu")
    assert f"{older}/config.yaml names {tmp_path}/older/gcmvn.npz, which does not exist" in caplog.text
    assert str(older / "gcmvn.npz") in repr(transcriber.feature_transforms)
    (older / "gcmvn.npz").unlink()
    with pytest.raises(FileNotFoundError) as error:
        Transcriber(checkpoint, data_dir=older, device="cpu")
    assert str(error.value).startswith(f"{older}/config.yaml applies global_cmvn with the statistics "
                                       f"{tmp_path}/older/gcmvn.npz, which cannot be found")
    assert "prepare it again (ssm-prepare-librispeech --cmvn global)" in str(error.value)


@pytest.fixture(scope="module")
def prepared_again(moved, tmp_path_factory) -> Path:
    """The same corpus prepared with the same options into another directory."""
    return prepare_fixture(tmp_path_factory.mktemp("prepared_again"), "--no-specaugment", "--cmvn", "global")


def test_the_same_preparation_elsewhere_decodes_and_resumes(moved, prepared_again, tmp_path):
    """The SentencePiece model records where it was trained, so its bytes differ; its pieces, scores, types and
    normalization do not."""
    data, checkpoint = moved
    assert (data / "spm_unigram24.model").read_bytes() != (prepared_again / "spm_unigram24.model").read_bytes()
    result = generate(prepared_again, checkpoint, "--max-tokens", "10000")
    assert result.returncode == 0 and "WER" in result.stdout + result.stderr, result.stderr[-3000:]
    assert Transcriber(checkpoint, data_dir=prepared_again, device="cpu").transcribe(audio_files(prepared_again)[:1])
    result = resume(prepared_again, checkpoint, tmp_path / "resumed")
    assert result.returncode == 0 and "done training" in result.stdout + result.stderr, result.stderr[-3000:]


def test_a_checkpoint_with_byte_digests_of_an_earlier_release_still_loads(moved, prepared_again, tmp_path, caplog):
    """A checkpoint whose fingerprint records the SentencePiece model by its bytes only: the same file loads
    silently, the same preparation elsewhere loads with a warning, another dictionary is refused."""
    data, checkpoint = moved

    def bytes_only(state: dict) -> None:
        record = state["cfg"]["model"]["dictionary_fingerprint"]["sentencepiece_model"]
        del record["content_sha256"], record["content_version"]

    old = edited(checkpoint, tmp_path / "old.pt", bytes_only)
    with caplog.at_level(logging.WARNING):
        Transcriber(old, data_dir=data, device="cpu")
        assert "recorded by its bytes" not in caplog.text
        Transcriber(old, data_dir=prepared_again, device="cpu")
    assert "recorded by its bytes (saved by an earlier version)" in caplog.text
    other = Path(shutil.copytree(prepared_again, tmp_path / "other"))
    lines = (other / "spm_unigram24.txt").read_text().splitlines(keepends=True)
    (other / "spm_unigram24.txt").write_text("".join([lines[1], lines[0], *lines[2:]]))
    with pytest.raises(DictionaryMismatchError, match="labels would decode to other units: dictionary: "):
        Transcriber(old, data_dir=other, device="cpu")
