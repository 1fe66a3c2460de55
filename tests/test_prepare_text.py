"""scripts/prepare_seq2seq.py and scripts/prepare_mlm.py: lines as fairseq reads them, named errors."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import prepare_mlm  # noqa: E402
import prepare_seq2seq  # noqa: E402

# Characters that str.splitlines() breaks a line at but fairseq (Python's universal newlines) does not.
NOT_LINE_BREAKS = "\u2028\u2029\x85\x0c\x0b\x1c"
WORDS = "the cat sat on the mat and a dog ran in the park today"


def fairseq_lines(path: Path) -> list[str]:
    """The lines of ``path`` as fairseq-preprocess reads them (text mode, UTF-8)."""
    with open(path, encoding="utf-8") as f:
        return f.readlines()


def seq2seq(tmp_path: Path, source: str | bytes, target: str, *extra: str) -> int:
    for name, text in (("train.src", source), ("train.tgt", target)):
        (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    files = [str(tmp_path / "train.src"), str(tmp_path / "train.tgt")]
    return prepare_seq2seq.main(["--train-text", *files, "--encode", *files, "--out", str(tmp_path / "bpe"),
                                 "--vocab-size", "30", *extra])


def test_seq2seq_pairs_stay_aligned_across_unicode_line_separators(tmp_path):
    source = "".join(f"{WORDS}{c}{WORDS}\n" for c in NOT_LINE_BREAKS) + "a last pair\r\nand one more\r"
    target = "".join(f"pair {n}\n" for n in range(len(NOT_LINE_BREAKS))) + "last\nmore\n"
    assert seq2seq(tmp_path, source, target) == 0
    encoded_source = fairseq_lines(tmp_path / "bpe/train.src")
    encoded_target = fairseq_lines(tmp_path / "bpe/train.tgt")
    assert len(encoded_source) == len(encoded_target) == len(NOT_LINE_BREAKS) + 2
    assert encoded_source[-1].replace(" ", "").replace("\u2581", "") == "andonemore\n"


def test_seq2seq_refuses_source_and_target_of_different_lengths(tmp_path, caplog):
    assert seq2seq(tmp_path, "one\ntwo\nthree\n", "un\ndeux\n") == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [f"{tmp_path}/train.src has 3 lines but {tmp_path}/train.tgt has 2: fairseq pairs their lines "
                      f"as parallel data, so the counts must match"]
    assert not (tmp_path / "bpe/train.src").exists()


def test_seq2seq_names_the_file_and_line_of_text_that_is_not_utf8(tmp_path, caplog):
    assert seq2seq(tmp_path, b"one\ncaf\xe9\n", "un\ndeux\n") == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith(f"{tmp_path}/train.src:2: not UTF-8 text"), errors


def test_seq2seq_names_a_vocabulary_smaller_than_the_character_set(tmp_path, caplog):
    assert seq2seq(tmp_path, f"{WORDS}\n", f"{WORDS}\n", "--vocab-size", "5") == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith("--vocab-size 5 is too small"), errors
    minimum = int(errors[0].split("use --vocab-size ")[1].split()[0])
    assert seq2seq(tmp_path, f"{WORDS}\n", f"{WORDS}\n", "--vocab-size", str(minimum)) == 0


def write_mlm_corpus(raw: Path, train: str | bytes = f"{WORDS}\n\n{WORDS}\n", labelled: bytes = b"") -> None:
    raw.mkdir()
    for split in prepare_mlm.SPLITS:
        text = train if split == "train" else f"{WORDS}\n"
        (raw / split).with_suffix(".txt").write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    if labelled:
        (raw / "labelled").mkdir()
        for split in prepare_mlm.LABELLED_SPLITS:
            (raw / "labelled" / f"{split}.tsv").write_bytes(b"pos\tgood\n" + (labelled if split == "valid" else b""))


def mlm(raw: Path, *extra: str) -> int:
    return prepare_mlm.main(["--raw", str(raw), "--out", str(raw.parent / "bpe"), "--vocab-size", "30", *extra])


def test_mlm_keeps_fairseqs_paragraphs_and_documents(tmp_path):
    train = "".join(f"{WORDS}{c}{WORDS}\n" for c in NOT_LINE_BREAKS) + "\n" + f"{WORDS}\n"
    write_mlm_corpus(tmp_path / "raw", train)
    assert mlm(tmp_path / "raw") == 0
    encoded = fairseq_lines(tmp_path / "bpe/train.bpe")
    assert len(encoded) == len(NOT_LINE_BREAKS) + 2 and encoded[len(NOT_LINE_BREAKS)] == "\n"


def test_mlm_names_the_file_and_line_of_text_that_is_not_utf8(tmp_path, caplog):
    write_mlm_corpus(tmp_path / "raw", labelled=b"neg\tna\xefve\n")
    assert mlm(tmp_path / "raw", "--labelled", str(tmp_path / "raw/labelled")) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith(f"{tmp_path}/raw/labelled/valid.tsv:2: not UTF-8"), errors


def test_mlm_names_a_vocabulary_smaller_than_the_character_set(tmp_path, caplog):
    write_mlm_corpus(tmp_path / "raw")
    assert mlm(tmp_path / "raw", "--vocab-size", "4") == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith("--vocab-size 4 is too small"), errors
