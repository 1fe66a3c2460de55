"""``ssm-export-onnx`` on a trained checkpoint, and the exported directory transcribing as the checkpoint does; then a
clean virtual environment with only the runtime's dependencies (no torch, no fairseq) transcribing a file.

A tiny causal model (``mssm_transducer_streaming``) is trained for two epochs on 12 utterances of the shipped mini
corpus prepared with ``--cmvn global`` (``test_transcribe.train_tiny``, about 30 s). The clean environment pip-installs
numpy, onnxruntime and soundfile and the package (about 25 s from pip's cache), so it is marked slow like the rest.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ssm_fairseq.asr import Recognizer
from ssm_fairseq.cli.export_onnx import main as export_main
from ssm_fairseq.deploy.recognizer import OnnxRecognizer

from test_transcribe import _one_thread, train_tiny  # noqa: F401  (_one_thread: an autouse fixture)

pytestmark = pytest.mark.slow

SEARCHES = {"greedy": {"beam": 1, "max_symbols_per_frame": 2, "blank_penalty": 20.0},
            "beam": {"beam": 3, "max_symbols_per_frame": 2, "blank_penalty": 20.0}}
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path, list[Path]]:
    """(checkpoint of a tiny causal model, its export with int8 copies, 4 test-mini files)."""
    root = tmp_path_factory.mktemp("onnx_checkpoint")
    checkpoint = train_tiny(root, 4, "mssm_transducer_streaming", ("--cmvn", "global")) / "checkpoint_last.pt"
    assert export_main(["--checkpoint", str(checkpoint), "--out", str(root / "exported"), "--int8"]) == 0
    return checkpoint, root / "exported", sorted((root / "LibriSpeech").glob("test-mini/*/*/*.flac"))


@pytest.mark.parametrize("search", sorted(SEARCHES))
def test_the_export_transcribes_as_the_checkpoint(exported, search):
    """fp32: the same transcripts and word times as ``Recognizer`` on the checkpoint (offline, batched PyTorch)."""
    checkpoint, out, files = exported
    expected = Recognizer(checkpoint, device="cpu", **SEARCHES[search]).transcribe(files, timestamps=True)
    assert all(t.text for t in expected)
    got = OnnxRecognizer(out, **SEARCHES[search]).transcribe(files, timestamps=True)
    assert [t.text for t in got] == [t.text for t in expected]
    for g, e in zip(got, expected):
        assert [w.word for w in g.words] == [w.word for w in e.words]
        assert [x for w in g.words for x in w[1:]] == pytest.approx([x for w in e.words for x in w[1:]], abs=1e-6)


def test_an_export_with_adaptive_cmvn_hears_and_transcribes_as_the_checkpoint_decoding_with_it(exported, tmp_path):
    """``--cmvn-adapt 50``: the runtime applies the data directory's global CMVN, then adaptive CMVN with the running
    statistics of each file (or stream): the features ``Recognizer(cmvn_adapt_frames=50)`` computes (not those of the
    export without it), and its transcripts, file by file and streamed in 80 ms chunks."""
    from ssm_fairseq.deploy.filterbank import log_mel_filterbank
    from ssm_fairseq.deploy.recognizer import read_16k_mono

    checkpoint, plain, files = exported
    out = tmp_path / "adaptive"
    assert export_main(["--checkpoint", str(checkpoint), "--out", str(out), "--cmvn-adapt", "50"]) == 0
    runtime = OnnxRecognizer(out)
    assert runtime.model.metadata["adaptive_cmvn"] == {"prior_frames": 50.0}
    assert OnnxRecognizer(plain).model.metadata["adaptive_cmvn"] is None
    fbank = log_mel_filterbank(read_16k_mono(files[0]))
    reference = Recognizer(checkpoint, device="cpu", cmvn_adapt_frames=50).feature_transforms(fbank)
    assert runtime.normalised(fbank, runtime.adaptive_cmvn()) == pytest.approx(reference, abs=1e-4)
    assert abs(OnnxRecognizer(plain).normalised(fbank) - reference).max() > 0.05  # adaptive CMVN moves the features
    for search in sorted(SEARCHES):
        expected = Recognizer(checkpoint, device="cpu", cmvn_adapt_frames=50, **SEARCHES[search]).transcribe(files)
        recognizer = OnnxRecognizer(out, **SEARCHES[search])
        assert recognizer.transcribe(files) == expected
        stream = recognizer.stream()
        assert [stream.stream_file(f, 80).text for f in files] == expected


def test_the_command_names_what_it_refuses(exported, tmp_path, capsys):
    """Exit 1 and the error on stderr (the command's log), nothing written."""
    checkpoint, out, _ = exported
    assert export_main(["--checkpoint", str(checkpoint), "--out", str(out)]) == 1
    assert "FileExistsError" in capsys.readouterr().err
    assert export_main(["--checkpoint", str(checkpoint), "--out", str(tmp_path / "x"), "--chunk-frames", "30"]) == 1
    assert "multiple of the sub-sampling stride (4)" in capsys.readouterr().err
    assert export_main(["--checkpoint", str(tmp_path / "none.pt"), "--out", str(tmp_path / "y")]) == 1
    assert "checkpoint not found" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


RUNTIME_ONLY = """
import json, sys
from ssm_fairseq.deploy.recognizer import OnnxRecognizer
recognizer = OnnxRecognizer(sys.argv[1], beam=3, max_symbols_per_frame=2, blank_penalty=20.0)
texts = recognizer.transcribe(sys.argv[2:])
assert not any(m.split(".")[0] in ("torch", "fairseq") for m in sys.modules)
print(json.dumps(texts))
"""


def test_a_clean_environment_with_the_runtime_dependencies_only_transcribes(exported, tmp_path):
    """A new virtual environment, then numpy, onnxruntime and soundfile from the package index and the package itself
    without its dependencies (the README's commands): torch is not installed, and the files transcribe as here.

    The environment is made ``--without-pip`` and this interpreter's pip installs into it (``--prefix``): the same
    packages from the same index, without bootstrapping a pip of its own (a third of the test's time)."""
    _, out, files = exported
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--ignore-installed", "--prefix", str(venv)]
    for packages in (["numpy", "onnxruntime", "soundfile"], ["--no-deps", str(REPO)]):
        install = subprocess.run(pip + packages, capture_output=True, text=True)
        assert install.returncode == 0, install.stderr[-3000:]
    check = subprocess.run([str(venv / "bin/python"), "-c", "import torch"], capture_output=True, cwd=tmp_path)
    assert check.returncode != 0  # no torch in this environment
    run = subprocess.run([str(venv / "bin/python"), "-c", RUNTIME_ONLY, str(out), *map(str, files)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout) == OnnxRecognizer(out, **SEARCHES["beam"]).transcribe(files)
