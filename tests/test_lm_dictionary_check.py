"""``--lm-path`` checks before the LM's weights are loaded: a language model, trained over the transducer's units in
their order (read from the LM's own data directory, its stored digest or its embedding size), and a usable weight.

End to end: the five-utterance fixture, a transducer trained one update, and language models trained one update on
text of the transducer's units binarised as a user would (``fairseq-preprocess --only-source`` with and without
``--srcdict``), decoded with the real ``fairseq-generate``."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch

from ssm_fairseq.integrity.language_model_check import check_language_model, load_language_model, \
    vocabulary_size
from ssm_fairseq.asr.search.lm_fusion import LanguageModelMismatchError
from ssm_fairseq.transcribe import Transcriber

from cli import BIN, REPO, run_ok
from spade_cases import SMALL, build
from test_fp16_decoding import prepare_fixture
from test_librispeech_recipe import TINY_MODEL

TRANSFORMER_LM = ("--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
                  "--decoder-attention-heads", "2", "--decoder-input-dim", "16", "--decoder-output-dim", "16")
SPADE_LM = ("--decoder-layers", "2", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
            "--decoder-attention-heads", "2", "--attention-window", "4", "--ssm-state-size", "4", "--global-layers",
            "1")


# --- the vocabulary size in the weights, whichever embedding the architecture has (no training)

@pytest.mark.parametrize("arch, flags", [
    ("transformer_lm", ()),
    ("transformer_lm", ("--adaptive-input", "--adaptive-input-cutoff", "10,20", "--adaptive-softmax-cutoff", "10,20",
                        "--tie-adaptive-weights")),
    ("transformer_lm", ("--adaptive-softmax-cutoff", "10,20")),
    ("lstm_lm", ()),
    ("spade_lm", ()),
    ("spade_lm", ("--adaptive-input", "--adaptive-input-cutoff", "12", "--adaptive-softmax-cutoff", "12")),
])
def test_the_vocabulary_size_is_read_from_the_embedding(arch, flags):
    extra = SMALL if arch == "spade_lm" else TRANSFORMER_LM[:2] if arch == "lstm_lm" else TRANSFORMER_LM
    model = build(arch, *extra, *flags, vocab_size=33)[0]
    assert vocabulary_size(model.state_dict()) == 33


# --- real checkpoints

def _text(symbols: list[str], counts: list[int]) -> str:
    """Lines of ``symbols``, symbol ``i`` written ``counts[i]`` times (fairseq-preprocess orders by these counts)."""
    tokens = [symbol for symbol, count in zip(symbols, counts) for _ in range(count)]
    return "".join(" ".join(tokens[i:i + 9]) + "\n" for i in range(0, len(tokens), 9))


def _train_lm(root: Path, name: str, arch: str, flags: tuple, text: str, *preprocess: str) -> Path:
    """``fairseq-preprocess --only-source *preprocess`` of ``text`` into ``root/name-bin``, then one update of
    ``fairseq-train --task language_modeling``: the checkpoint."""
    (root / f"{name}.txt").write_text(text)
    run_ok([str(BIN / "fairseq-preprocess"), "--only-source", "--trainpref", str(root / f"{name}.txt"), "--destdir",
            str(root / f"{name}-bin"), "--workers", "1", *preprocess])
    run_ok([str(BIN / "fairseq-train"), str(root / f"{name}-bin"), "--user-dir", "ssm_fairseq", "--task",
            "language_modeling", "--arch", arch, *flags, "--tokens-per-sample", "32", "--optimizer", "adam", "--lr",
            "1e-3", "--max-update", "1", "--batch-size", "2", "--save-dir", str(root / name), "--no-epoch-checkpoints",
            "--disable-validation", "--num-workers", "0", "--cpu"])
    return root / name / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """The data directory, a transducer, and LMs over its units: ``right`` (a ``spade_lm``, ``--srcdict
    DATA/dict.txt``), ``frequency`` (a ``transformer_lm``, binarised without ``--srcdict``: the same units ordered by
    frequency, here the reverse) and ``padded`` (a ``transformer_lm``, without ``--srcdict`` on text whose frequencies
    follow the dictionary: the same order, then ``--padding-factor 16``'s madeupword symbols)."""
    root = tmp_path_factory.mktemp("lm_dictionary_check")
    data = prepare_fixture(root, "--no-specaugment")
    run_ok([str(BIN / "fairseq-train"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
            "--train-subset", "train-fixture", "--arch", "mssm_transducer", *TINY_MODEL.split(), "--criterion",
            "transducer", "--optimizer", "adam", "--lr", "1e-3", "--max-update", "1", "--batch-size", "3",
            "--disable-validation", "--num-workers", "0", "--save-dir", str(root / "asr"), "--cpu"])
    symbols = [line.split()[0] for line in (data / "dict.txt").read_text().splitlines()]
    rising, falling = list(range(1, len(symbols) + 1)), list(range(len(symbols), 0, -1))
    return {
        "data": data, "asr": root / "asr/checkpoint_last.pt",
        "right": _train_lm(root, "right", "spade_lm", SPADE_LM, _text(symbols, rising), "--srcdict",
                           str(data / "dict.txt")),
        "frequency": _train_lm(root, "frequency", "transformer_lm", TRANSFORMER_LM, _text(symbols, rising)),
        "padded": _train_lm(root, "padded", "transformer_lm", TRANSFORMER_LM, _text(symbols, falling),
                            "--padding-factor", "16"),
    }


def generate(trained: dict[str, Path], lm: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "fairseq-generate"), str(trained["data"]), "--user-dir", "ssm_fairseq", "--task",
                           "speech_transducer", "--path", str(trained["asr"]), "--gen-subset", "test-fixture",
                           "--beam", "2", "--scoring", "wer", "--lm-path", str(lm), "--lm-weight", "0.5", "--cpu",
                           *flags], capture_output=True, text=True, cwd=REPO)


def moved_data(source: Path, target: Path, data: Path | str) -> Path:
    """A copy of checkpoint ``source`` at ``target`` recording ``data`` as its training data directory (one that was
    moved or deleted since, or another one)."""
    state = torch.load(source, map_location="cpu", weights_only=False)
    state["cfg"]["task"]["data"] = str(data)
    torch.save(state, target)
    return target


def _units(data: Path) -> list[str]:
    """``data/dict.txt``'s units as ``Dictionary.load`` numbers them: fairseq's four special symbols first."""
    return ["<s>", "<pad>", "</s>", "<unk>"] + [line.split()[0] for line in (data / "dict.txt").open()]


@pytest.mark.slow
def test_an_lm_over_the_units_in_frequency_order_is_refused_by_fairseq_generate(trained):
    """The defect: same units, another order, exit 0 and a WER of nonsense. Now the LM's own dict.txt is compared."""
    units, lm = _units(trained["data"]), trained["frequency"]
    result = generate(trained, lm)
    assert result.returncode != 0
    expected = (f"LanguageModelMismatchError: the language model {lm} (trained with {lm.parent.parent}/frequency-bin/"
                f"dict.txt)'s unit 4 is {units[-1]!r} where the transducer's is {units[4]!r}: fusion needs an LM "
                f"trained over the transducer's dictionary (fairseq-preprocess --only-source --srcdict "
                f"{trained['data']}/dict.txt)")
    assert expected in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
def test_an_lm_of_another_size_is_named_when_its_data_is_gone(trained, tmp_path):
    """fairseq-generate used to fail in load_state_dict with a size mismatch; now the sizes are named up front."""
    lm = moved_data(trained["padded"], tmp_path / "lm.pt", tmp_path / "gone")
    result = generate(trained, lm)
    assert result.returncode != 0 and "size mismatch" not in result.stderr
    assert (f"the language model {lm} has 32 units (its embedding; its training data directory's "
            f"{tmp_path}/gone/dict.txt (cfg.task.data) no longer exists) and the transducer 24 "
            f"({trained['data']}/dict.txt)") in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
def test_padding_of_the_same_units_is_named(trained):
    lm = trained["padded"]
    with pytest.raises(LanguageModelMismatchError, match=re.escape(
            f"has 32 units and the transducer 24, the first 24 the same; the rest are 8 madeupword symbols, which "
            f"fairseq-preprocess adds")):
        check_language_model(lm, trained["data"])


@pytest.mark.slow
def test_without_its_data_the_digest_of_a_spade_lm_is_compared(trained, tmp_path):
    lm = moved_data(trained["right"], tmp_path / "lm.pt", tmp_path / "gone")
    check_language_model(lm, trained["data"])  # the digest is the transducer's
    reordered = tmp_path / "reordered"
    reordered.mkdir()
    lines = (trained["data"] / "dict.txt").read_text().splitlines()
    (reordered / "dict.txt").write_text("\n".join(lines[1:] + lines[:1]) + "\n")
    with pytest.raises(LanguageModelMismatchError, match=re.escape(
            f"the language model {lm} was trained with another dictionary than {reordered}/dict.txt (the "
            f"transducer's): its source_dictionary_digest is ")):
        check_language_model(lm, reordered)


@pytest.mark.slow
def test_where_nothing_can_be_checked_a_warning_says_so(trained, tmp_path, caplog):
    lm = moved_data(trained["frequency"], tmp_path / "lm.pt", tmp_path / "gone")
    check_language_model(lm, trained["data"])
    assert (f"--lm-path {lm}: cannot check that the language model was trained over the transducer's units in their "
            f"order: its training data directory's {tmp_path}/gone/dict.txt (cfg.task.data) no longer exists, its "
            f"weights store no dictionary digest (spade_lm's do) and its 24 units are as many as the transducer's"
            ) in caplog.text


@pytest.mark.slow
def test_a_rewritten_dict_txt_in_the_lms_data_directory_is_not_trusted(trained, tmp_path, caplog):
    """The padded LM recorded as trained on the speech data directory, whose dict.txt has 24 units, not 32."""
    lm = moved_data(trained["padded"], tmp_path / "lm.pt", trained["data"])
    with pytest.raises(LanguageModelMismatchError, match="has 32 units .* and the transducer 24"):
        check_language_model(lm, trained["data"])
    assert (f"{trained['data']}/dict.txt is not the dictionary the language model was trained with (it has 24 "
            f"units and the weights' embedding 32") in caplog.text


@pytest.mark.slow
def test_the_transcribers_loader_checks_too(trained):
    with pytest.raises(LanguageModelMismatchError, match="unit 4 is"):
        load_language_model(trained["frequency"], trained["data"], torch.device("cpu"))
    lm = load_language_model(trained["right"], trained["data"], torch.device("cpu"))
    assert len(lm.decoder.dictionary) == 24
    with pytest.raises(LanguageModelMismatchError, match="unit 4 is"):  # ssm-transcribe --lm-path's path
        Transcriber(trained["asr"], trained["data"], device="cpu", lm_path=trained["frequency"], lm_weight=0.5)


@pytest.mark.slow
def test_a_checkpoint_that_is_no_lm_is_named(trained):
    result = generate(trained, trained["asr"])
    assert result.returncode != 0 and "AttributeError" not in result.stderr
    assert (f"NotALanguageModelError: --lm-path {trained['asr']}: a checkpoint of --task speech_transducer --arch "
            f"mssm_transducer (a TransducerModel), not a language model") in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("weight, message", [
    ("-0.5", "--lm-weight must be a finite number >= 0 (typically 0.1 to 1), got -0.5"),
    ("1e38", "--lm-weight 1e+38 is too large: times the language model's log-probabilities (as low as "),
])
def test_a_negative_or_overflowing_weight_is_named(trained, weight, message):
    result = generate(trained, trained["right"], "--lm-weight", weight)
    assert result.returncode != 0 and "LanguageModelWeightError: " + message in result.stderr, result.stderr[-3000:]
    assert "audio" not in result.stderr.split("LanguageModelWeightError")[-1]
