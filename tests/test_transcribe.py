"""python -m ssm_fairseq.transcribe and transcribe(): fairseq-generate's hypotheses, from the audio files alone.

A tiny model is trained for two epochs on 12 utterances of the shipped mini corpus (prepare_librispeech.py,
fairseq-train, average_checkpoints.py, as the recipe runs them) and its averaged checkpoint decodes 5 others.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from fairseq import checkpoint_utils
from omegaconf import OmegaConf

from ssm_fairseq.asr.features.audio_features import audio_frames
from ssm_fairseq.asr.search.word_timestamps import LEAD_FRAMES, word_timestamps
from ssm_fairseq.transcribe import PRECISIONS, InputError, TimedTranscript, Transcriber, timed_words_json, transcribe
from ssm_fairseq.transcribe import main as transcribe_main

from cli import BIN, REPO, run_ok
from test_librispeech_recipe import TINY_MODEL
from toy_transducer import MarkerJoiner

pytestmark = pytest.mark.slow

MINI = REPO / "recipes/librispeech/mini/LibriSpeech"
# Searches through padded batches (max_tokens 500: 3 then 2 of the 131-216-frame test files; or 2, 2, 1 files).
# A blank penalty far above the logits' spread makes every frame emit labels, so no hypothesis compared is empty.
SETTINGS = {
    "exact": {"beam": 3, "search": "exact", "max_symbols_per_frame": 2, "lenpen": 0.5, "blank_penalty": 20.0,
              "max_tokens": 500},
    "modified": {"beam": 2, "search": "modified", "blank_penalty": 20.0, "batch_size": 2},
}
SEARCH = SETTINGS["exact"]
SINGLE_THREAD = dict(os.environ, OMP_NUM_THREADS="1")  # tiny models decode fastest on one thread


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / f"scripts/{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _copy_utterances(subset: str, chapters: int, per_chapter: int, corpus: Path) -> None:
    """The first ``per_chapter`` utterances of the first ``chapters`` chapters of a mini corpus subset."""
    for source in sorted((MINI / subset).glob("*/*"))[:chapters]:
        target = corpus / subset / source.relative_to(MINI / subset)
        target.mkdir(parents=True)
        (transcript,) = source.glob("*.trans.txt")
        lines = transcript.read_text().splitlines()[:per_chapter]
        (target / transcript.name).write_text("".join(line + "\n" for line in lines))
        for line in lines:
            shutil.copy(source / f"{line.split()[0]}.flac", target)


def train_tiny(root: Path, test_files: int, arch: str = "mssm_transducer", prepare_args: tuple = ()) -> Path:
    """Prepare 12 train-mini and ``test_files`` test-mini utterances under ``root`` (``root/LibriSpeech``, then
    ``root/data``) and train a tiny ``arch`` on them for two epochs; returns the checkpoint directory."""
    corpus, data, checkpoints = root / "LibriSpeech", root / "data", root / "checkpoints"
    _copy_utterances("train-mini", 2, 6, corpus)
    _copy_utterances("test-mini", 1, test_files, corpus)
    assert _script("prepare_librispeech").main([
        "--librispeech-root", str(corpus), "--out", str(data), "--subsets", "train-mini,test-mini",
        "--vocab-size", "40", "--no-specaugment", "--jobs", "1", *prepare_args]) == 0
    run_ok([str(BIN / "fairseq-train"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
            "--train-subset", "train-mini", "--arch", arch, *TINY_MODEL.split(), "--criterion",
            "transducer", "--optimizer", "adam", "--lr", "3e-3", "--max-epoch", "2", "--batch-size", "4",
            "--disable-validation", "--save-dir", str(checkpoints), "--num-workers", "0", "--seed", "1", "--cpu"],
           env=SINGLE_THREAD)
    return checkpoints


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, list[Path]]:
    """(data directory, averaged checkpoint, the test-mini files in manifest order)."""
    root = tmp_path_factory.mktemp("transcribe")
    corpus, data, checkpoints = root / "LibriSpeech", root / "data", train_tiny(root, 5)
    assert _script("average_checkpoints").main(["--checkpoint-dir", str(checkpoints), "--last", "2", "--output",
                                                str(checkpoints / "checkpoint_avg2.pt")]) == 0
    rows = (data / "test-mini.tsv").read_text().splitlines()[1:]
    files = [next(corpus.glob(f"test-mini/*/*/{row.split()[0]}.flac")) for row in rows]
    return data, checkpoints / "checkpoint_avg2.pt", files


def _cli_options(search: dict) -> list[str]:
    return [item for name, value in search.items() for item in (f"--{name.replace('_', '-')}", str(value))]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_function_and_cli_print_fairseq_generates_hypotheses(trained, tmp_path, name):
    data, checkpoint, files = trained
    search = SETTINGS[name]
    run_ok([str(BIN / "fairseq-generate"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
            "--path", str(checkpoint), "--gen-subset", "test-mini", "--post-process", "sentencepiece",
            *_cli_options(search), "--results-path", str(tmp_path), "--cpu"], env=SINGLE_THREAD)
    decoded = dict(re.findall(r"^D-(\d+)\t\S+\t(.*)$", (tmp_path / "generate-test-mini.txt").read_text(), flags=re.M))
    expected = [decoded[str(i)] for i in range(len(files))]  # sample ids are manifest rows
    assert all(text.strip() and "\u2581" not in text for text in expected), expected  # words, not pieces; none empty
    assert transcribe(files, checkpoint, device="cpu", **search) == expected
    if name == "exact":  # the command line, given the files in reverse order: one line per file, in the order given
        out = subprocess.run([sys.executable, "-m", "ssm_fairseq.transcribe", "--checkpoint", str(checkpoint),
                              *_cli_options(search), "--cpu", *map(str, files[::-1])],
                             capture_output=True, text=True, cwd=REPO, env=SINGLE_THREAD)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.splitlines() == [f"{path}\t{text}" for path, text in zip(files[::-1], expected[::-1])]


def test_44khz_stereo_gives_the_features_and_transcript_of_16khz_mono(trained, tmp_path):
    """A 16 kHz file resampled to 44.1 kHz, in two channels (the second at half level), is downmixed and resampled
    back to 16 kHz: its features differ from the original's by the two resamplers' error only (mostly in the top
    mel bins, at their roll-off below 8 kHz; the downmix's level change is a constant that utterance CMVN removes).
    Measured on 20 mini corpus files: median 0.004-0.008, 99th percentile 0.02-0.15 (CMVN units), and the same
    transcript for every one. Asserted: the same frames, median < 0.02 and 99th percentile < 0.3 (two different
    utterances: median 0.3-0.45), and the same transcript."""
    import torchaudio.functional

    _, checkpoint, files = trained
    mono, rate = sf.read(files[1], dtype="float32")
    resampled = torchaudio.functional.resample(torch.from_numpy(mono), rate, 44100).numpy()
    stereo = tmp_path / "stereo44k.flac"
    sf.write(stereo, np.stack([resampled, 0.5 * resampled], axis=1), 44100, subtype="PCM_24")
    transcriber = Transcriber(checkpoint, device="cpu", **SEARCH)
    original, converted, other = (transcriber.features(path) for path in (files[1], stereo, files[0]))
    assert converted.shape == original.shape
    assert audio_frames(files[1]) == len(original) and abs(audio_frames(stereo) - len(converted)) <= 1  # headers
    difference = (converted - original).abs()
    assert difference.median() < 0.02 and difference.quantile(0.99) < 0.3, difference
    assert (other - original[:len(other)]).abs().median() > 0.2  # another utterance: 0.3-0.45 on the mini corpus
    texts = transcriber.transcribe([files[1], stereo])
    assert texts[0] == texts[1] and texts[0].strip()


def test_every_bad_file_is_named_and_nothing_is_decoded(trained, tmp_path):
    _, checkpoint, files = trained
    missing, unreadable, empty = tmp_path / "missing.flac", tmp_path / "unreadable.flac", tmp_path / "empty.wav"
    unreadable.write_bytes(b"not audio at all")
    sf.write(empty, np.zeros(200, dtype=np.float32), 16000)  # shorter than one 25 ms window
    transcriber = Transcriber(checkpoint, device="cpu", beam=1)
    with pytest.raises(InputError) as error:
        transcriber.transcribe([files[0], missing, unreadable, empty])
    problems = error.value.problems  # all three, in input order; the good file is not named
    assert len(problems) == 3 and problems[0] == f"{missing}: audio file not found"
    assert problems[1].startswith(f"{unreadable}: unreadable audio (")
    assert problems[2] == f"{empty}: empty audio (200 samples at 16000 Hz)"
    out = subprocess.run([sys.executable, "-m", "ssm_fairseq.transcribe", "--checkpoint", str(checkpoint), "--cpu",
                          str(files[0]), str(missing)], capture_output=True, text=True, cwd=REPO, env=SINGLE_THREAD)
    assert out.returncode == 1 and out.stdout == ""
    assert f"{missing}: audio file not found" in out.stderr and "1 of 2 audio files cannot be transcribed" in out.stderr


def test_a_moved_data_directory_is_named_and_data_dir_finds_it(trained, tmp_path):
    data, checkpoint, files = trained
    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    state["cfg"] = OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True)  # as fairseq stores it
    state["cfg"]["task"].data = str(tmp_path / "elsewhere")  # trained on another machine
    moved = tmp_path / "moved.pt"
    torch.save(state, moved)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path}/elsewhere/config.yaml: config not found "
                                                          "(the checkpoint's data directory; pass --data-dir")):
        Transcriber(moved, device="cpu")
    (tmp_path / "partial").mkdir()  # config.yaml without the dictionary it names
    shutil.copy(data / "config.yaml", tmp_path / "partial")
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path}/partial/spm_unigram40.txt: the dictionary ")):
        Transcriber(moved, data_dir=tmp_path / "partial", device="cpu")
    assert transcribe(files[:2], moved, data_dir=data, device="cpu", **SEARCH) == \
        transcribe(files[:2], checkpoint, device="cpu", **SEARCH)
    state["cfg"]["task"]._name = "speech_to_text"
    torch.save(state, moved)
    with pytest.raises(ValueError, match="a checkpoint of --task speech_to_text; transcription needs a --task "
                                         "speech_transducer checkpoint"):
        Transcriber(moved, data_dir=data, device="cpu")


def test_a_checkpoint_of_an_earlier_release_decodes_with_the_later_options_at_their_defaults(trained, tmp_path):
    """A checkpoint saved before ``--causal-encoder`` existed stores no such field; fairseq fills an architecture's
    (``--arch mssm_transducer``) missing fields from nothing, so the model must (at their defaults)."""
    data, checkpoint, files = trained
    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    state["cfg"] = OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True)  # as fairseq stores it
    assert state["cfg"]["model"]["_name"] == "mssm_transducer" and not state["cfg"]["model"].pop("causal_encoder")
    older = tmp_path / "older.pt"
    torch.save(state, older)
    assert transcribe(files[:2], older, device="cpu", **SEARCH) == transcribe(files[:2], checkpoint, device="cpu",
                                                                               **SEARCH)


@pytest.mark.parametrize("precision, flag", [("bfloat16", "--bf16"), ("float16", "--fp16")])
def test_half_precision_gives_fairseq_generates_hypotheses_in_that_precision(trained, tmp_path, precision, flag):
    data, checkpoint, files = trained
    run_ok([str(BIN / "fairseq-generate"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
            "--path", str(checkpoint), "--gen-subset", "test-mini", "--post-process", "sentencepiece", flag,
            *_cli_options(SEARCH), "--results-path", str(tmp_path), "--cpu"], env=SINGLE_THREAD)
    decoded = dict(re.findall(r"^D-(\d+)\t\S+\t(.*)$", (tmp_path / "generate-test-mini.txt").read_text(), flags=re.M))
    expected = [decoded[str(i)] for i in range(len(files))]
    transcriber = Transcriber(checkpoint, device="cpu", precision=precision, **SEARCH)
    assert {p.dtype for p in transcriber.model.parameters()} == {PRECISIONS[precision]}
    assert transcriber.transcribe(files) == expected


def test_cli_bf16_and_a_float16_overflow_names_the_files(trained):
    _, checkpoint, files = trained
    out = subprocess.run([sys.executable, "-m", "ssm_fairseq.transcribe", "--checkpoint", str(checkpoint), "--bf16",
                          *_cli_options(SEARCH), "--cpu", *map(str, files[:2])],
                         capture_output=True, text=True, cwd=REPO, env=SINGLE_THREAD)
    assert out.returncode == 0 and "in bfloat16" in out.stderr, out.stderr[-3000:]
    assert [line.split("\t")[0] for line in out.stdout.splitlines()] == list(map(str, files[:2]))
    # logits beyond float16's range (65504) make NaN scores: an error naming every file of the batch, no transcript
    transcriber = Transcriber(checkpoint, device="cpu", precision="float16", **SEARCH)
    with torch.no_grad():
        transcriber.model.joiner.output.weight.mul_(1e5)
    with pytest.raises(InputError) as error:
        transcriber.transcribe(files[:2])
    assert sorted(problem.split(":")[0] for problem in error.value.problems) == sorted(map(str, files[:2]))
    assert all("not finite" in problem and "without --fp16" in problem for problem in error.value.problems)


@pytest.mark.parametrize("name", ["tab\tin.flac", "line\nbreak.flac"])
def test_cli_refuses_a_file_name_the_tsv_output_cannot_show(tmp_path, name):
    """Refused before the checkpoint is read (this one does not exist): nothing is decoded or printed."""
    audio = tmp_path / name
    out = subprocess.run([sys.executable, "-m", "ssm_fairseq.transcribe", "--checkpoint", str(tmp_path / "none.pt"),
                          "--cpu", str(audio)], capture_output=True, text=True, cwd=REPO, env=SINGLE_THREAD)
    assert out.returncode == 2 and out.stdout == ""
    assert (f"error: {str(audio)!r}: a file name holding a tab or a line break cannot be printed as "
            "PATH<TAB>transcript; rename the file") in out.stderr


@pytest.mark.parametrize("option, flag, value", [("lenpen", "--lenpen", "nan"), ("blank_penalty", "--blank-penalty",
                                                                                  "inf")])
def test_non_finite_search_options_are_refused_naming_the_option(trained, option, flag, value):
    _, checkpoint, files = trained
    with pytest.raises(ValueError, match=f"^{flag} must be a finite number, got {value}$"):
        Transcriber(checkpoint, device="cpu", **{option: float(value)})
    out = subprocess.run([sys.executable, "-m", "ssm_fairseq.transcribe", "--checkpoint", str(checkpoint), flag,
                          value, "--cpu", str(files[0])], capture_output=True, text=True, cwd=REPO, env=SINGLE_THREAD)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().splitlines()[-1].endswith(f"| ERROR | ssm_fairseq.transcribe | {flag} must be a finite "
                                                        f"number, got {value}")


LM_ARCHS = {  # tiny language models over the transducer's units, trained for a few updates
    "spade_lm": "--decoder-layers 1 --decoder-embed-dim 16 --decoder-ffn-embed-dim 32 --decoder-attention-heads 2 "
                "--attention-window 4 --ssm-state-size 4",
    "transformer_lm": "--decoder-layers 1 --decoder-embed-dim 16 --decoder-ffn-embed-dim 32 "
                      "--decoder-attention-heads 2",
}


def train_language_models(data: Path, root: Path, archs=tuple(LM_ARCHS)) -> dict[str, Path]:
    """{arch: checkpoint} of tiny LMs (``LM_ARCHS``, 10 updates) trained on the training transcripts of the speech
    data directory ``data``, over its dictionary, as recipe stages 6-7 train them; their files under ``root``."""
    assert _script("prepare_lm_text").main(["--data", str(data), "--out", str(root / "text"), "--train-manifests",
                                            "train-mini", "--valid-manifests", "test-mini"]) == 0
    run_ok([str(BIN / "fairseq-preprocess"), "--only-source", "--srcdict", str(data / "dict.txt"), "--trainpref",
            str(root / "text/train.txt"), "--validpref", str(root / "text/valid.txt"), "--destdir", str(root / "bin"),
            "--workers", "1"])
    checkpoints = {}
    for arch in archs:
        run_ok([str(BIN / "fairseq-train"), str(root / "bin"), "--user-dir", "ssm_fairseq", "--task",
                "language_modeling", "--arch", arch, *LM_ARCHS[arch].split(), "--sample-break-mode", "eos",
                "--tokens-per-sample", "256", "--optimizer", "adam", "--lr", "1e-2", "--max-update", "10",
                "--batch-size", "4", "--required-batch-size-multiple", "1", "--save-dir", str(root / arch),
                "--no-epoch-checkpoints", "--num-workers", "0", "--cpu"], env=SINGLE_THREAD)
        checkpoints[arch] = root / arch / "checkpoint_best.pt"
    return checkpoints


@pytest.fixture(scope="module")
def language_models(trained, tmp_path_factory) -> dict[str, Path]:
    """{arch: checkpoint} of LMs trained on the fixture's training transcripts, as recipe stages 6-7 train them."""
    data, _, _ = trained
    return train_language_models(data, tmp_path_factory.mktemp("lm"))


def _scored(path: Path) -> tuple[dict[str, str], dict[str, float], dict[str, list[float]]]:
    """fairseq-generate's D- texts, H- scores and P- per-unit scores by sample id."""
    text = path.read_text()
    texts = dict(re.findall(r"^D-(\d+)\t\S+\t(.*)$", text, flags=re.M))
    scores = {i: float(s) for i, s in re.findall(r"^H-(\d+)\t(\S+)\t", text, flags=re.M)}
    positional = {i: [float(x) for x in p.split()] for i, p in re.findall(r"^P-(\d+)\t(.*)$", text, flags=re.M)}
    return texts, scores, positional


@pytest.mark.parametrize("arch", list(LM_ARCHS))
def test_fairseq_generate_and_transcribe_fuse_a_language_model(trained, language_models, tmp_path, arch):
    """fairseq-generate --lm-path / --lm-weight and transcribe(lm_path=, lm_weight=) agree; H- scores are the fused
    scores (not the transducer's) and the P- per-unit scores still sum to them."""
    data, checkpoint, files = trained
    outputs = {}
    for weight in ("0", "0.8"):
        out = tmp_path / weight
        run_ok([str(BIN / "fairseq-generate"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
                "--path", str(checkpoint), "--gen-subset", "test-mini", "--post-process", "sentencepiece",
                *_cli_options(SEARCH), "--lm-path", str(language_models[arch]), "--lm-weight", weight,
                "--results-path", str(out), "--cpu"], env=SINGLE_THREAD)
        outputs[weight] = _scored(out / "generate-test-mini.txt")
    texts, scores, positional = outputs["0.8"]
    for i, score in scores.items():
        assert sum(positional[i]) == pytest.approx(score, abs=1e-3 * len(positional[i]))
        assert score != outputs["0"][1][i]  # the LM's scores are in the score
    expected = [texts[str(i)] for i in range(len(files))]
    assert transcribe(files, checkpoint, device="cpu", lm_path=language_models[arch], lm_weight=0.8,
                      **SEARCH) == expected
    plain = [outputs["0"][0][str(i)] for i in range(len(files))]
    assert transcribe(files, checkpoint, device="cpu", **SEARCH) == plain  # weight 0: the search without an LM
    out = subprocess.run([sys.executable, "-m", "ssm_fairseq.transcribe", "--checkpoint", str(checkpoint),
                          *_cli_options(SEARCH), "--lm-path", str(language_models[arch]), "--lm-weight", "0.8",
                          "--cpu", *map(str, files)], capture_output=True, text=True, cwd=REPO, env=SINGLE_THREAD)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == [f"{path}\t{text}" for path, text in zip(files, expected)]


def test_fusion_without_the_lm_dictionary_or_the_lm_is_refused(trained, language_models, tmp_path):
    data, checkpoint, files = trained
    bare = tmp_path / "data"
    shutil.copytree(data, bare)
    (bare / "dict.txt").unlink()
    out = subprocess.run([str(BIN / "fairseq-generate"), str(bare), "--user-dir", "ssm_fairseq", "--task",
                          "speech_transducer", "--path", str(checkpoint), "--gen-subset", "test-mini", "--lm-path",
                          str(language_models["spade_lm"]), "--lm-weight", "0.5", "--cpu"],
                         capture_output=True, text=True, cwd=REPO, env=SINGLE_THREAD)
    assert out.returncode != 0 and f"loads the language model with {bare}/dict.txt, which does not exist" in out.stderr
    with pytest.raises(FileNotFoundError, match=re.escape(f"{bare}/dict.txt: not found")):
        Transcriber(checkpoint, data_dir=bare, device="cpu", lm_path=language_models["spade_lm"], lm_weight=0.5)
    with pytest.raises(ValueError, match="--lm-weight 0.5 needs a language model"):
        Transcriber(checkpoint, device="cpu", lm_weight=0.5)



def _check_timed(timed: TimedTranscript, duration: float, frame_seconds: float) -> None:
    """Every word inside the audio, start <= end, in order (neighbours share at most their emission frame), and the
    words spell the transcript."""
    words = timed.words
    assert all(0 <= w.start <= w.end <= duration for w in words), (duration, words)
    assert all(a.start <= b.start and a.end <= b.end and b.start >= a.end - frame_seconds - 1e-9
               for a, b in zip(words, words[1:])), words
    assert [w.word for w in words] == timed.text.split()
    if "  " not in timed.text:  # two word boundaries in a row leave two spaces, which no list of words can spell
        assert " ".join(w.word for w in words) == timed.text


def test_timestamps_lie_in_the_audio_in_order_and_are_fairseq_generates_alignment(trained, tmp_path):
    """With timestamps, the same transcripts; each word timed by the frames fairseq-generate --print-alignment hard
    prints for its units (H- pieces without --post-process), 40 ms per encoder frame (tr stride 4), within the file.
    """
    data, checkpoint, files = trained
    transcriber = Transcriber(checkpoint, device="cpu", **SEARCH)
    assert transcriber.frame_seconds == pytest.approx(0.04)
    timed = transcriber.transcribe(files, timestamps=True)
    assert [t.text for t in timed] == transcriber.transcribe(files)
    assert all(t.words for t in timed)  # the blank penalty makes every file emit words
    durations = [sf.info(str(path)).duration for path in files]
    for t, duration in zip(timed, durations):
        _check_timed(t, duration, 0.04)
    run_ok([str(BIN / "fairseq-generate"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
            "--path", str(checkpoint), "--gen-subset", "test-mini", "--print-alignment", "hard", *_cli_options(SEARCH),
            "--results-path", str(tmp_path), "--cpu"], env=SINGLE_THREAD)
    decoded = (tmp_path / "generate-test-mini.txt").read_text()
    pieces = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", decoded, flags=re.M))
    frames = dict(re.findall(r"^A-(\d+)\t(.*)$", decoded, flags=re.M))
    for i, (t, duration) in enumerate(zip(timed, durations)):
        units = pieces[str(i)].split()
        emitted = [int(pair.split("-")[0]) for pair in frames[str(i)].split()]
        assert t.words == word_timestamps(units, emitted, 0.04, duration)
    # the module function, and an empty list
    assert transcribe(files[:1], checkpoint, device="cpu", timestamps=True, **SEARCH) == timed[:1]
    assert transcriber.transcribe([], timestamps=True) == []


def test_cli_timestamps_print_a_json_list_of_words_start_end(trained):
    _, checkpoint, files = trained
    expected = Transcriber(checkpoint, device="cpu", **SEARCH).transcribe(files[:3], timestamps=True)
    out = subprocess.run([sys.executable, "-m", "ssm_fairseq.transcribe", "--checkpoint", str(checkpoint),
                          "--timestamps", *_cli_options(SEARCH), "--cpu", *map(str, files[:3])],
                         capture_output=True, text=True, cwd=REPO, env=SINGLE_THREAD)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 3
    for line, path, timed in zip(lines, files, expected):
        name, text, words = line.split("\t")
        assert (name, text) == (str(path), timed.text)
        words = json.loads(words)
        assert words == [[w.word, round(w.start, 2), round(w.end, 2)] for w in timed.words]
        assert all(isinstance(word, str) and all(round(x, 2) == x for x in (start, end)) for word, start, end in words)

def test_cli_help_documents_timestamps(capsys):
    with pytest.raises(SystemExit):
        transcribe_main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--timestamps" in help_text and "JSON list of [word, start, end] in seconds" in help_text


class _OnsetEncoder(torch.nn.Module):
    """The trained encoder's frames and lengths, each frame's output replaced by 1.0 where sound starts, else 0.0.

    A filterbank frame holds sound when any bin is above the file's floor (digital silence gives every bin its
    minimum, exactly); an encoder frame (the 4 filterbank frames the fixture's ``tr`` sub-sampler stacks) holds
    sound when one of its frames does, and sound starts at the first frame of each run. An acoustic model that
    knows where speech is, and nothing else.
    """

    stride = 4

    def __init__(self, encoder: torch.nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, features, lengths):
        out = self.encoder(features, lengths)
        onsets = torch.zeros_like(out["encoder_out"][..., :1])
        for b, (n, m) in enumerate(zip(lengths.tolist(), out["encoder_lengths"].tolist())):
            assert m == -(-n // self.stride)  # the real sub-sampler's frames
            x = features[b, :n]
            sound = torch.zeros(m * self.stride, dtype=torch.bool)
            sound[:n] = (x > x.amin(0) + 1e-3).any(-1)[:m * self.stride]
            voiced = sound.reshape(m, self.stride).any(-1)
            onsets[b, :m, 0] = (voiced & ~torch.cat([voiced.new_zeros(1), voiced[:-1]])).float()
        return dict(out, encoder_out=onsets)




def test_after_a_known_silence_the_next_word_starts_after_it(trained, tmp_path):
    """A file = utterance A + 2.0 s of digital silence + utterance B (16 kHz).

    The fixture's model (2 epochs on 12 utterances) cannot place words: with the default search it emits nothing on
    these files, with a blank penalty it emits units at every frame, the silence included (printed below). So the
    timing chain is checked with its encoder's and joiner's outputs replaced by an oracle that emits one word at
    each onset of sound (``_OnsetEncoder``): the features, utterance CMVN, the sub-sampler's frame counts, padded
    batches sorted by length, greedy search, the generator's alignment, units -> words -> seconds all run for real.
    Asserted: the first word after A is emitted at most 55 ms before B's first non-zero sample (the first filterbank
    frame to reach it starts up to 25 ms before it, and its encoder frame up to 30 ms before that) and not after it,
    and starts ``LEAD_FRAMES`` blank frames before that frame (a word's start reaches back over the blank frames
    before it, ``word_timestamps``); A's words start as in A alone; B's first word as in the file of B after 0.7 s
    of silence, shifted by A and the longer silence (to within one 40 ms frame: the encoder frames fall on other
    samples), in the same batch (four files of different lengths), where it is emitted within the same 55 ms of
    its first sound. The trained model's words on the joined file are then checked for what holds whatever it
    emits: inside the audio, in order, spelling the text.
    """
    _, checkpoint, files = trained
    rate, silence = 16000, 2.0
    (a, rate_a), (b, rate_b) = sf.read(files[0], dtype="float32"), sf.read(files[1], dtype="float32")
    assert rate_a == rate_b == rate and a.ndim == b.ndim == 1
    joined, late = tmp_path / "a_silence_b.wav", tmp_path / "silence_b.wav"
    sf.write(joined, np.concatenate([a, np.zeros(int(silence * rate), np.float32), b]), rate)
    sf.write(late, np.concatenate([np.zeros(int(0.7 * rate), np.float32), b]), rate)  # B after 0.7 s, alone
    a_end, b_lead = len(a) / rate, np.flatnonzero(b)[0] / rate  # B's first non-zero sample, in B
    b_sound = a_end + silence + b_lead  # and in the joined file

    transcriber = Transcriber(checkpoint, device="cpu", beam=1, max_symbols_per_frame=1)
    unit = next(i for i, piece in enumerate(transcriber.dictionary.symbols) if piece.startswith("\u2581")
                and len(piece) > 1)
    model = transcriber.model
    model.encoder = _OnsetEncoder(model.encoder)
    model.joiner = MarkerJoiner(len(transcriber.dictionary), model.blank, unit)
    timed = transcriber.transcribe([files[0], joined, late, files[1]], timestamps=True)  # one batch, reordered
    a_words, joined_words, late_words, b_words = (t.words for t in timed)
    print(f"\nA ends at {a_end:.3f} s, B's sound starts at {b_sound:.3f} s; oracle words (start, end):")
    print([(round(w.start, 3), round(w.end, 3)) for w in joined_words])
    assert a_words and b_words
    # a word starts LEAD_FRAMES blank frames before the frame the oracle emits it at, its sound's first
    lead = LEAD_FRAMES * transcriber.frame_seconds
    after_a = [w for w in joined_words if w.start >= a_end]
    assert after_a and b_sound - 0.055 <= after_a[0].start + lead <= b_sound + 1e-9, (after_a, b_sound)
    assert [w.start for w in joined_words if w.start < a_end] == [w.start for w in a_words]
    # B after 0.7 s of silence: as in the joined file, shifted by A and 1.3 s more silence (B alone has no
    # silence before its first word for the lead to reach over)
    assert after_a[0].start == pytest.approx(late_words[0].start + a_end + silence - 0.7, abs=0.04 + 1e-9)
    assert 0.7 + b_lead - 0.055 <= late_words[0].start + lead <= 0.7 + b_lead + 1e-9
    duration = sf.info(str(joined)).duration
    _check_timed(timed[1], duration, transcriber.frame_seconds)

    searches = {"default search": {}, "the tests' search (blank penalty 20)": dict(SEARCH, max_tokens=None)}
    for name, search in searches.items():
        timed = Transcriber(checkpoint, device="cpu", **search).transcribe([joined], timestamps=True)[0]
        print(f"trained model, {name}: {timed.text!r}\n{timed_words_json(timed.words)}")
        _check_timed(timed, duration, 0.04)


def test_a_checkpoint_trained_in_bf16_decodes_in_the_precision_asked_for(trained, tmp_path):
    """fairseq keeps the training run's ``--bf16`` in the checkpoint's task config, which the task's
    ``build_generator`` reads: transcription must still decode in float32 when float32 is asked for (and say so)."""
    data, checkpoint, files = trained
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    state["cfg"]["task"].bf16 = state["cfg"]["common"]["bf16"] = True  # as fairseq-train --bf16 saves them
    trained_bf16 = tmp_path / "trained_bf16.pt"
    torch.save(state, trained_bf16)
    transcriber = Transcriber(trained_bf16, device="cpu", **SEARCH)
    assert {p.dtype for p in transcriber.model.parameters()} == {torch.float32}
    assert transcriber.generator.model_dtype() == torch.float32
    expected = Transcriber(checkpoint, device="cpu", **SEARCH).transcribe(files[:2])
    out = subprocess.run([sys.executable, "-m", "ssm_fairseq.transcribe", "--checkpoint", str(trained_bf16),
                          *_cli_options(SEARCH), "--cpu", *map(str, files[:2])],
                         capture_output=True, text=True, cwd=REPO, env=SINGLE_THREAD)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "on cpu in float32" in out.stderr
    assert out.stdout.splitlines() == [f"{path}\t{text}" for path, text in zip(files[:2], expected)]


def test_a_61_s_file_is_transcribed_in_windows_and_one_over_max_tokens_says_what_to_do(trained, tmp_path):
    """A 61 s file (the model takes 6000 frames, 60 s; it was refused before long files were windowed): transcribed
    in 30 s windows, in order with the short file, its windows logged; a file over --max-tokens: raise it."""
    _, checkpoint, files = trained
    long = tmp_path / "long.flac"
    sf.write(long, np.random.default_rng(0).uniform(-0.1, 0.1, 61 * 16000).astype(np.float32), 16000)
    out = subprocess.run([sys.executable, "-m", "ssm_fairseq.transcribe", "--checkpoint", str(checkpoint), "--cpu",
                          str(files[0]), str(long)], capture_output=True, text=True, cwd=REPO, env=SINGLE_THREAD)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [line.split("\t")[0] for line in out.stdout.splitlines()] == [str(files[0]), str(long)]
    assert f"{long}: 61 of 61 s transcribed (3/3 windows)" in out.stderr
    with pytest.raises(InputError, match=re.escape(f"{files[0]}: {audio_frames(files[0]) / 100:.1f} s of audio "
                                                   f"({audio_frames(files[0])} feature frames), more than a batch "
                                                   "holds (max_tokens, --max-tokens 100): raise --max-tokens to at "
                                                   f"least {audio_frames(files[0])}")):
        Transcriber(checkpoint, device="cpu", max_tokens=100).transcribe(files[:1])


def test_audio_converted_to_16khz_mono_is_logged(trained, tmp_path):
    """An 8 kHz copy transcribes differently from the 16 kHz original (its top mel bins are empty): one line per
    kind of conversion says so, naming the files."""
    import torchaudio.functional

    _, checkpoint, files = trained
    mono, rate = sf.read(files[1], dtype="float32")
    narrow, stereo = tmp_path / "8k.wav", tmp_path / "stereo.flac"
    sf.write(narrow, torchaudio.functional.resample(torch.from_numpy(mono), rate, 8000).numpy(), 8000)
    sf.write(stereo, np.stack([mono, mono], axis=1), rate)
    out = subprocess.run([sys.executable, "-m", "ssm_fairseq.transcribe", "--checkpoint", str(checkpoint), "--beam",
                          "1", "--cpu", str(files[1]), str(narrow), str(stereo), str(narrow)],
                         capture_output=True, text=True, cwd=REPO, env=SINGLE_THREAD)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (f"2 files not 16 kHz mono: resampled from 8000 Hz (no sound above 4000 Hz) (to 16 kHz mono): {narrow}, "
            f"{narrow}") in out.stderr
    assert f"1 file not 16 kHz mono: 2 channels downmixed (to 16 kHz mono): {stereo}" in out.stderr
    assert str(files[1]) not in out.stderr.split("not 16 kHz mono", 1)[1]


def test_cli_split_at_pauses_transcribes_a_joined_recording_as_its_pieces(trained, tmp_path):
    """``--split-at-pauses 0.5`` (``Windowing.pause_seconds``): two files joined with 1 s of faint noise between them
    give the API's transcript cut at pauses. (Streamed: tests/test_pause_endpoints.py.)"""
    _, checkpoint, files = trained
    rng = np.random.default_rng(0)
    noise = lambda: rng.normal(0, 1 / 32768, 16000).astype(np.float32)  # noqa: E731
    joined = tmp_path / "joined.wav"
    sf.write(joined, np.concatenate([noise(), sf.read(files[0], dtype="float32")[0], noise(),
                                     sf.read(files[1], dtype="float32")[0], noise()]), 16000, subtype="PCM_16")
    (expected,) = Transcriber(checkpoint, device="cpu", pause_seconds=0.5, **SEARCH).transcribe([joined])
    out = subprocess.run([sys.executable, "-m", "ssm_fairseq.transcribe", "--checkpoint", str(checkpoint),
                          *_cli_options(SEARCH), "--cpu", "--split-at-pauses", "0.5", str(joined)],
                         capture_output=True, text=True, cwd=REPO, env=SINGLE_THREAD)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == f"{joined}\t{expected}\n"
    with pytest.raises(ValueError, match="pause_seconds must be at least 0, got -1"):
        Transcriber(checkpoint, device="cpu", pause_seconds=-1)
