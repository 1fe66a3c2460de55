"""scripts/prepare_lm_text.py: language-model text in a transducer's units, every bad input named."""
from __future__ import annotations

import gzip
import importlib.util
import sys

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


def test_bad_inputs_are_named(data, tmp_path, caplog):
    out = str(tmp_path / "lm")
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
    with pytest.raises(SystemExit):
        prepare_lm_text.main(["--data", str(data), "--out", out, "--train-text", str(empty)])  # no validation text
