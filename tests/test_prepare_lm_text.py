"""scripts/prepare_lm_text.py: language-model text in a transducer's units, every bad input named, and a failed run
leaves the previous train.txt and valid.txt as they were."""
from __future__ import annotations

import gzip
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import sentencepiece as spm
import yaml

from cli import REPO

spec = importlib.util.spec_from_file_location("prepare_lm_text", REPO / "scripts/prepare_lm_text.py")
prepare_lm_text = sys.modules["prepare_lm_text"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prepare_lm_text)

SENTENCES = ["the cat sat on the mat", "a dog ran to the park", "the bird sang in the tree"]


@pytest.fixture
def data(tmp_path):
    """A speech data directory with config.yaml naming a SentencePiece model, and a manifest."""
    text = tmp_path / "text.txt"
    text.write_text("\n".join(SENTENCES * 5) + "\n")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "spm"), vocab_size=24,
                                   hard_vocab_limit=False,
                                   model_type="unigram", bos_id=0, pad_id=1, eos_id=2, unk_id=3)
    tokenizer = {"bpe": "sentencepiece", "sentencepiece_model": "spm.model"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"bpe_tokenizer": tokenizer}))
    rows = [f"utt{i}\tx.npy:0:1\t10\t{s}\tspk" for i, s in enumerate(SENTENCES)]
    (tmp_path / "dev.tsv").write_text("id\taudio\tn_frames\ttgt_text\tspeaker\n" + "\n".join(rows) + "\n")
    return tmp_path


def test_text_files_and_manifests_become_lower_cased_pieces(data, tmp_path):
    corpus = tmp_path / "corpus.txt.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as out:
        out.write("THE CAT SAT ON THE MAT\n\nA DOG RAN\u2028TO THE PARK\n")  # U+2028 is not a line break
    out = tmp_path / "lm"
    assert prepare_lm_text.main(["--data", str(data), "--out", str(out), "--train-text", str(corpus),
                                 "--valid-manifests", "dev"]) == 0
    model = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    train = (out / "train.txt").read_text(encoding="utf-8").split("\n")[:-1]
    # three lines (U+2028 does not end one, as for fairseq), the empty one kept as fairseq-preprocess keeps it
    assert len(train) == 3 and train[1] == ""
    assert train[0] == " ".join(model.encode("the cat sat on the mat", out_type=str))
    assert (out / "valid.txt").read_text().splitlines() == [" ".join(model.encode(s, out_type=str))
                                                            for s in SENTENCES]


def outputs(out: Path) -> dict[str, bytes]:
    """Every file in ``out`` (temporary files included), by name."""
    return {path.name: path.read_bytes() for path in out.iterdir()}


def test_bad_inputs_are_named_and_leave_the_previous_outputs(data, tmp_path, caplog):
    out = str(tmp_path / "lm")
    assert prepare_lm_text.main(["--data", str(data), "--out", out, "--train-manifests", "dev",
                                 "--valid-manifests", "dev"]) == 0
    previous = outputs(tmp_path / "lm")
    assert sorted(previous) == ["train.txt", "valid.txt"]
    assert prepare_lm_text.main(["--data", str(data), "--out", out, "--train-text", str(tmp_path / "nowhere.txt"),
                                 "--valid-manifests", "dev"]) == 1
    assert f"{tmp_path}/nowhere.txt: no such file" in caplog.text
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("the cat\ncaf\u00e9 au lait\n".encode("latin-1"))
    assert prepare_lm_text.main(["--data", str(data), "--out", out, "--train-text", str(latin),
                                 "--valid-manifests", "dev"]) == 1
    assert f"{latin}:2: not UTF-8 text" in caplog.text
    (data / "bad.tsv").write_text("id\taudio\n")
    assert prepare_lm_text.main(["--data", str(data), "--out", out, "--train-manifests", "bad",
                                 "--valid-manifests", "dev"]) == 1
    assert f"{data}/bad.tsv: no tgt_text column" in caplog.text
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert prepare_lm_text.main(["--data", str(data), "--out", out, "--train-text", str(empty),
                                 "--valid-manifests", "dev"]) == 1
    assert "train.txt: no sentence to write (empty input)" in caplog.text
    # train.txt complete, valid.txt's text empty: neither is replaced
    assert prepare_lm_text.main(["--data", str(data), "--out", out, "--train-manifests", "dev",
                                 "--valid-text", str(empty)]) == 1
    assert "valid.txt: no sentence to write (empty input)" in caplog.text
    assert outputs(tmp_path / "lm") == previous
    with pytest.raises(SystemExit):
        prepare_lm_text.main(["--data", str(data), "--out", out, "--train-text", str(empty)])  # no validation text


def test_an_empty_train_text_leaves_the_previous_train_txt(data, tmp_path):
    """The command with an empty ``--train-text`` used to leave the previous ``train.txt`` at 0 bytes."""
    command = [sys.executable, "-m", "ssm_fairseq.cli.prepare_lm_text", "--data", str(data), "--out",
               str(tmp_path / "lm"), "--valid-manifests", "dev"]
    subprocess.run([*command, "--train-manifests", "dev"], check=True, capture_output=True, cwd=REPO)
    previous = outputs(tmp_path / "lm")
    (tmp_path / "empty.txt").touch()
    result = subprocess.run([*command, "--train-text", str(tmp_path / "empty.txt")], capture_output=True, text=True,
                            cwd=REPO)
    assert result.returncode == 1 and "train.txt: no sentence to write (empty input)" in result.stderr
    assert outputs(tmp_path / "lm") == previous
