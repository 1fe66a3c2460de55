"""The ONNX Runtime recognizer (``ssm_fairseq.deploy``): its numpy filterbank equals the project's features, its
transcripts (greedy and beam, words and their times) equal PyTorch's on the same model and audio, offline and
streamed alike, a damaged or mixed directory is refused, named, and the runtime runs with torch and fairseq
unimportable.

A tiny untrained model built in memory (``onnx_tiny_model``), exported once; audio of the shipped mini corpus.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
import torch

from ssm_fairseq.asr.search.transducer_generator import TransducerGenerator
from ssm_fairseq.asr.search.word_timestamps import word_timestamps
from ssm_fairseq.asr.features.audio_features import log_mel_filterbank as project_filterbank
from ssm_fairseq.deploy import filterbank
from ssm_fairseq.deploy.errors import ExportDirectoryError
from ssm_fairseq.deploy.exporter import export_model
from ssm_fairseq.deploy.manifest import MANIFEST
from ssm_fairseq.deploy.recognizer import OnnxRecognizer, read_16k_mono

from onnx_tiny_model import MINI_TEST, REPO, SEARCHES, metadata_of, mini_features, tiny_model

CHUNK = 32


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(model, its CMVN statistics, exported directory with int8 copies, 3 mini test files, their filterbanks)."""
    files, fbanks, cmvn = mini_features(3)
    model = tiny_model("ms", seed=3)
    out = tmp_path_factory.mktemp("runtime") / "exported"
    export_model(model, metadata_of(model, cmvn), out, CHUNK, int8=True)
    return model, cmvn, out, files, fbanks


def test_numpy_filterbank_equals_the_projects_features():
    """Against torchaudio's Kaldi fbank in float64: 1e-5. Against the project's (float32) features: the median
    difference below 1e-5 and the largest below 1e-3 (float32 spectra round low-energy mel bins: torchaudio in float32
    differs from itself in float64 as much). Streamed in odd chunks: the same frames."""
    from torchaudio.compliance import kaldi

    for path in MINI_TEST[:3]:
        samples = sf.read(str(path), dtype="float32")[0]
        ours = filterbank.log_mel_filterbank(samples)
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)  # torchaudio builds its mel banks in the default dtype
        try:
            exact = kaldi.fbank(torch.from_numpy(samples).double().mul(32768).unsqueeze(0), num_mel_bins=80,
                                frame_length=25.0, frame_shift=10.0, sample_frequency=16000).numpy()
        finally:
            torch.set_default_dtype(default)
        np.testing.assert_allclose(ours, exact, atol=1e-5)
        difference = np.abs(ours - project_filterbank(samples, 16000))
        assert np.median(difference) < 1e-5 and difference.max() < 1e-3
        stream = filterbank.StreamingFilterbank()
        streamed = np.concatenate([stream.accept_waveform(samples[i:i + 777]) for i in range(0, len(samples), 777)])
        np.testing.assert_array_equal(streamed, ours)
    assert filterbank.log_mel_filterbank(np.zeros(399, np.float32)).shape == (0, 80)


def _pytorch_transcripts(model, cmvn, fbanks, search):
    """What ``asr.Recognizer`` computes for these filterbanks: CMVN, the encoder's forward, the generator's search,
    ``Dictionary.string`` and word times."""
    d = model.dictionary
    generator = TransducerGenerator([model], d, beam=search["beam"], max_symbols_per_frame=search[
        "max_symbols_per_frame"], length_norm=1.0, blank_penalty=search["blank_penalty"])
    results = []
    with torch.no_grad():
        for fbank in fbanks:
            features = torch.from_numpy(cmvn(fbank)).float().unsqueeze(0)
            encoder = model.encoder(features, torch.tensor([features.shape[1]]))
            searching = generator.search(1, torch.device("cpu"))
            searching.advance(encoder["encoder_out"], encoder["encoder_lengths"])
            best = searching.finish(1, 1.0)[0][0]
            text = d.string(torch.tensor(best.tokens), "sentencepiece",
                            extra_symbols_to_ignore=generator.symbols_to_strip_from_output)
            kept = [(t, f) for t, f in zip(best.tokens, best.frames) if t not in {d.bos(), d.eos()}]
            words = word_timestamps([d[t] for t, _ in kept], [f for _, f in kept], 0.04, len(fbank) / 100 + 0.015)
            results.append((text, words, best.score))
    return results


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_transcripts_equal_pytorch_offline_and_streamed(exported, name):
    model, cmvn, out, files, fbanks = exported
    expected = _pytorch_transcripts(model, cmvn, fbanks, SEARCHES[name])
    assert sum(bool(text.strip()) for text, _, _ in expected) >= 2  # (a file of lone "▁" units only gives "")
    recognizer = OnnxRecognizer(out, **SEARCHES[name], lenpen=1.0)
    offline = recognizer.transcribe(files, timestamps=True)
    assert [t.text for t in offline] == [text for text, _, _ in expected]
    for got, (_, words, _) in zip(offline, expected):
        assert [w.word for w in got.words] == [w.word for w in words]
        assert [x for w in got.words for x in w[1:]] == pytest.approx([x for w in words for x in w[1:]], abs=0.02)
    assert recognizer.transcribe(files) == [t.text for t in offline]
    stream = recognizer.stream(timestamps=True)
    for chunk_ms in (10, 250):
        assert [stream.stream_file(path, chunk_ms) for path in files] == offline
    int8 = OnnxRecognizer(out, "int8", **SEARCHES[name]).transcribe(files)
    assert len(int8) == len(files) and all(isinstance(t, str) for t in int8)


def test_streamed_partials_are_detokenized_incrementally(exported):
    """Each chunk's partial transcript is the whole partial hypothesis's text (``OnnxRecognizer.text``), while only the
    units after those the previous chunk's hypothesis shares are detokenized: fewer than all units of every chunk."""
    _, _, out, files, _ = exported
    recognizer = OnnxRecognizer(out, **SEARCHES["beam"], lenpen=1.0)
    stream = recognizer.stream()
    samples = read_16k_mono(files[0])
    whole_texts = 0
    for start in range(0, len(samples), 1600):  # 100 ms chunks
        partial = stream.accept_waveform(samples[start:start + 1600])
        tokens = stream.search.partial(recognizer.length_norm).tokens
        assert partial == recognizer.text(tokens)
        whole_texts += len(tokens)
    assert 0 < stream.partial_text.units_detokenized < whole_texts
    assert stream.finish().text == recognizer.transcribe(files[:1])[0]


def test_bad_audio_is_named_before_anything_is_decoded(exported, tmp_path):
    _, _, out, files, _ = exported
    sf.write(tmp_path / "8k.wav", np.zeros(8000, np.float32), 8000)
    sf.write(tmp_path / "short.wav", np.zeros(100, np.float32), 16000)
    (tmp_path / "junk.flac").write_bytes(b"not audio")
    from ssm_fairseq.asr.transcripts import InputError

    with pytest.raises(InputError) as error:
        OnnxRecognizer(out, beam=1).transcribe([files[0], tmp_path / "8k.wav", tmp_path / "short.wav",
                                                tmp_path / "junk.flac", tmp_path / "missing.wav"])
    problems = error.value.problems
    assert len(problems) == 4
    assert "8k.wav: 8000 Hz audio" in problems[0] and "short.wav: empty audio" in problems[1]
    assert "junk.flac: unreadable audio" in problems[2] and "missing.wav: audio file not found" in problems[3]


def _copy(exported_dir, tmp_path, name):
    target = tmp_path / name
    shutil.copytree(exported_dir, target)
    return target


def test_a_missing_or_mismatched_file_is_refused_named(exported, tmp_path):
    model, cmvn, out, _, _ = exported
    missing = _copy(out, tmp_path, "missing")
    (missing / "joiner.onnx").unlink()
    with pytest.raises(ExportDirectoryError, match="joiner.onnx: missing"):
        OnnxRecognizer(missing)
    damaged = _copy(out, tmp_path, "damaged")
    with open(damaged / "predictor.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ExportDirectoryError, match="predictor.onnx: not the file the manifest lists"):
        OnnxRecognizer(damaged)
    no_manifest = _copy(out, tmp_path, "no_manifest")
    (no_manifest / MANIFEST).unlink()
    with pytest.raises(ExportDirectoryError, match="no manifest"):
        OnnxRecognizer(no_manifest)
    # the encoder of another export, with the manifest's checksum edited to match: its export id gives it away
    other = tmp_path / "other"
    export_model(model, metadata_of(model, cmvn), other, CHUNK)
    mixed = _copy(out, tmp_path, "mixed")
    shutil.copy(other / "encoder.onnx", mixed / "encoder.onnx")
    manifest = json.loads((mixed / MANIFEST).read_text())
    manifest["files"]["encoder.onnx"] = json.loads((other / MANIFEST).read_text())["files"]["encoder.onnx"]
    (mixed / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ExportDirectoryError, match="encoder.onnx: from another export"):
        OnnxRecognizer(mixed)
    with pytest.raises(ExportDirectoryError, match="lists no encoder.int8.onnx"):
        OnnxRecognizer(other, "int8")


TORCH_BLOCKED = """
import sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "fairseq", "torchaudio"):
            raise ImportError(f"{name} is blocked")
sys.meta_path.insert(0, Blocked())
import json
from ssm_fairseq.deploy.recognizer import OnnxRecognizer
recognizer = OnnxRecognizer(sys.argv[1], beam=int(sys.argv[2]), max_symbols_per_frame=2, blank_penalty=20.0)
print(json.dumps(recognizer.transcribe(sys.argv[3:])))
assert not any(name.split(".")[0] in ("torch", "fairseq") for name in sys.modules), "torch or fairseq imported"
"""


@pytest.mark.parametrize("beam", [1, 3])
def test_the_runtime_needs_neither_torch_nor_fairseq(exported, beam):
    """In a process where importing torch, torchaudio or fairseq fails, the recognizer loads and transcribes, giving
    the transcripts it gives here."""
    _, _, out, files, _ = exported
    run = subprocess.run([sys.executable, "-c", TORCH_BLOCKED, str(out), str(beam), *map(str, files)],
                         capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    search = SEARCHES["greedy" if beam == 1 else "beam"]
    assert json.loads(run.stdout) == OnnxRecognizer(out, **search).transcribe(files)


def test_transcribe_run_writes_the_command_lines_outputs(exported, capsys):
    """``deploy.transcribe.run``, given ssm-transcribe's parsed arguments and ``--onnx``: the lines ``--checkpoint``
    would print, ``PATH<TAB>text<TAB>timed words``, offline and streamed; flags it cannot honour are refused."""
    from ssm_fairseq.cli.transcribe import Output, parse_args
    from ssm_fairseq.deploy.transcribe import run

    _, _, out, files, _ = exported
    expected = OnnxRecognizer(out, **SEARCHES["greedy"]).transcribe(files, timestamps=True)
    for stream in ([], ["--stream"]):
        args = parse_args(["--checkpoint", "unused", "--beam", "1", "--max-symbols-per-frame", "2", "--blank-penalty",
                           "20", "--timestamps", *stream, *map(str, files)])
        args.onnx, args.onnx_precision = str(out), "fp32"
        assert run(args, Output(args)) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line.split("\t")[:2] for line in lines] == [[str(f), t.text] for f, t in zip(files, expected)]
        assert [json.loads(line.split("\t")[2]) for line in lines] == [
            [[w.word, round(w.start, 2), round(w.end, 2)] for w in t.words] for t in expected]
    refused = argparse.Namespace(**{**vars(args), "lm_path": "lm.pt"})
    assert run(refused, Output(refused)) == 1


def test_transcribe_run_cuts_segments_at_endpoints_offline(exported, capsys):
    """``--onnx --endpoints`` offline: each file's segments are ``split_words`` of the recognizer's timed words with
    the exported model's frame (the segments a checkpoint's recognizer would write from the same words)."""
    from ssm_fairseq.asr.endpoints import split_words
    from ssm_fairseq.asr.segment_formats import format_json
    from ssm_fairseq.cli.transcribe import Output, parse_args
    from ssm_fairseq.deploy.transcribe import run, stream_duration

    _, _, out, files, _ = exported
    recognizer = OnnxRecognizer(out, **SEARCHES["greedy"])
    args = parse_args(["--checkpoint", "unused", "--beam", "1", "--max-symbols-per-frame", "2", "--blank-penalty",
                       "20", "--endpoints", "--endpoint-silence-after-speech", "0.2", "--format", "json",
                       *map(str, files)])
    args.onnx, args.onnx_precision = str(out), "fp32"
    assert run(args, Output(args)) == 0
    expected = [(str(f), split_words(t.words, stream_duration(str(f)), args.endpoint_rules, t.text,
                                     frame_seconds=recognizer.frame_seconds))
                for f, t in zip(files, recognizer.transcribe(files, timestamps=True))]
    assert capsys.readouterr().out == format_json(expected, False)


TORCH_BLOCKED_COMMAND = TORCH_BLOCKED.split("import json")[0] + """
from ssm_fairseq.cli.transcribe import main
code = main(sys.argv[1:])
assert not any(name.split(".")[0] in ("torch", "fairseq") for name in sys.modules), "torch or fairseq imported"
sys.exit(code)
"""


def test_the_command_transcribes_with_onnx_without_torch(exported):
    """``ssm-transcribe --onnx DIR`` in a process where torch, torchaudio and fairseq cannot be imported: the
    recognizer's transcripts, one ``PATH<TAB>text`` line per file; ``--checkpoint`` and ``--onnx`` together are a
    usage error."""
    _, _, out, files, _ = exported
    flags = ["--onnx", str(out), "--beam", "1", "--max-symbols-per-frame", "2", "--blank-penalty", "20"]
    run = subprocess.run([sys.executable, "-c", TORCH_BLOCKED_COMMAND, *flags, *map(str, files)],
                         capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    expected = OnnxRecognizer(out, **SEARCHES["greedy"]).transcribe(files)
    assert [line.split("\t") for line in run.stdout.splitlines()] == [[str(f), t] for f, t in zip(files, expected)]
    both = subprocess.run([sys.executable, "-c", TORCH_BLOCKED_COMMAND, "--checkpoint", "x.pt", *flags, str(files[0])],
                          capture_output=True, text=True, cwd=REPO)
    assert both.returncode == 2 and "give --checkpoint or --onnx DIR, one of them" in both.stderr


def test_an_offline_export_transcribes_as_pytorch_and_does_not_stream(tmp_path):
    """A bidirectional model on utterance CMVN exported ``--offline``: greedy and beam transcripts and word times as
    the PyTorch forward and searches; ``stream`` refused, named."""
    from fairseq.data.audio.feature_transforms.utterance_cmvn import UtteranceCMVN

    files, fbanks, _ = mini_features(3)
    model, cmvn = tiny_model("tr", causal=False, seed=3), UtteranceCMVN()
    out = tmp_path / "offline"
    export_model(model, metadata_of(model, cmvn), out, offline=True, piece_frames=8)
    for name in sorted(SEARCHES):
        expected = _pytorch_transcripts(model, cmvn, fbanks, SEARCHES[name])
        assert sum(bool(text.strip()) for text, _, _ in expected) >= 2
        recognizer = OnnxRecognizer(out, **SEARCHES[name], lenpen=1.0)
        got = recognizer.transcribe(files, timestamps=True)
        assert [t.text for t in got] == [text for text, _, _ in expected]
        for transcript, (_, words, _) in zip(got, expected):
            assert [w.word for w in transcript.words] == [w.word for w in words]
    with pytest.raises(ValueError, match="offline .* cannot stream"):
        recognizer.stream()
