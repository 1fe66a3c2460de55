"""Adaptive CMVN through the recognizer: a causal model decodes with ``cmvn_adapt_frames`` streamed in any chunks as
offline, long files through the windows as whole, ``ssm-transcribe --cmvn-adapt`` streamed as offline; a data
directory whose config applies ``adaptive_cmvn`` trains and decodes, and exports to ONNX.

A tiny causal model is trained for two epochs on 12 utterances of the mini corpus prepared with ``--cmvn global``
and ``adaptive_cmvn`` added to its config.yaml (``features.adaptive_cmvn``'s configuration).
"""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from ssm_fairseq.asr import Recognizer
from ssm_fairseq.asr.features.audio_features import filterbank_features
from ssm_fairseq.asr.features.transforms import transformed
from ssm_fairseq.deploy.exporter import checkpoint_metadata
from ssm_fairseq.transcribe import main as transcribe_main

from cli import BIN, run_ok
from test_transcribe import (SINGLE_THREAD, TINY_MODEL, _copy_utterances, _one_thread,  # noqa: F401 (autouse)
                             _script)

pytestmark = pytest.mark.slow

SEARCH = {"beam": 3, "max_symbols_per_frame": 2, "blank_penalty": 20.0}  # the tiny model emits labels


@pytest.fixture(scope="module")
def causal_adaptive(tmp_path_factory):
    """(data directory, checkpoint of a causal model trained on global + adaptive CMVN, 4 test-mini files): as
    ``train_tiny`` prepares and trains, with ``adaptive_cmvn`` added to config.yaml in between."""
    root = tmp_path_factory.mktemp("adaptive")
    corpus, data, checkpoints = root / "LibriSpeech", root / "data", root / "checkpoints"
    _copy_utterances("train-mini", 2, 6, corpus)
    _copy_utterances("test-mini", 1, 4, corpus)
    assert _script("prepare_librispeech").main([
        "--librispeech-root", str(corpus), "--out", str(data), "--subsets", "train-mini,test-mini",
        "--vocab-size", "40", "--no-specaugment", "--jobs", "1", "--cmvn", "global"]) == 0
    config = yaml.safe_load((data / "config.yaml").read_text())
    config["feature_transforms"] = {split: ["global_cmvn", "adaptive_cmvn"] for split in ("_train", "*")}
    config["adaptive_cmvn"] = {"prior_frames": 50}
    (data / "config.yaml").write_text(yaml.safe_dump(config))
    run_ok([str(BIN / "fairseq-train"), str(data), "--user-dir", "ssm_fairseq", "--task", "speech_transducer",
            "--train-subset", "train-mini", "--arch", "mssm_transducer_streaming", *TINY_MODEL.split(),
            "--criterion", "transducer", "--optimizer", "adam", "--lr", "3e-3", "--max-epoch", "2", "--batch-size",
            "4", "--disable-validation", "--save-dir", str(checkpoints), "--num-workers", "0", "--seed", "1",
            "--cpu"], env=SINGLE_THREAD)
    return data, checkpoints / "checkpoint_last.pt", sorted(corpus.glob("test-mini/*/*/*.flac"))


def test_a_config_with_adaptive_cmvn_trains_and_streams_as_offline(causal_adaptive):
    data, checkpoint, files = causal_adaptive
    recognizer = Recognizer(checkpoint, device="cpu", **SEARCH)
    assert [type(t).__name__ for t in recognizer.feature_transforms.transforms] == ["GlobalCMVN", "AdaptiveCMVN"]
    offline = recognizer.transcribe(files)
    assert all(offline)
    for chunk_ms in (10, 320, 1000):
        stream = recognizer.stream()
        assert [stream.stream_file(path, chunk_ms).text for path in files] == offline


@pytest.mark.parametrize("prior_frames", [0, 20, 1000])
def test_decode_time_adaptation_streams_as_offline(causal_adaptive, prior_frames):
    data, checkpoint, files = causal_adaptive
    recognizer = Recognizer(checkpoint, device="cpu", cmvn_adapt_frames=prior_frames, **SEARCH)
    assert recognizer.feature_transforms.transforms[1].prior_frames == prior_frames
    offline = recognizer.transcribe(files)
    stream = recognizer.stream()
    assert [stream.stream_file(path, 320).text for path in files] == offline
    fbank, _ = filterbank_features(files[0])
    state = recognizer.feature_stream()
    chunks = np.concatenate([recognizer.transform_chunk(fbank[i:i + 7], state) for i in range(0, len(fbank), 7)])
    assert np.array_equal(chunks, transformed(recognizer.feature_transforms, fbank))
    with pytest.raises(ValueError, match="keeps statistics per stream"):
        recognizer.transform_chunk(fbank[:5])  # a chunk without its stream's state would restart the statistics


def test_long_files_through_windows_equal_whole_files(causal_adaptive):
    data, checkpoint, files = causal_adaptive
    whole = Recognizer(checkpoint, device="cpu", cmvn_adapt_frames=20, **SEARCH).transcribe(files)
    windowed = Recognizer(checkpoint, device="cpu", cmvn_adapt_frames=20, window_seconds=0.5,
                          window_context_seconds=0.0, **SEARCH).transcribe(files)
    assert windowed == whole


def test_cli_streams_as_offline(causal_adaptive, capsys):
    data, checkpoint, files = causal_adaptive
    options = ["--checkpoint", str(checkpoint), "--cpu", "--beam", "3", "--max-symbols-per-frame", "2",
               "--blank-penalty", "20", "--cmvn-adapt", "30", *map(str, files)]
    assert transcribe_main(options) == 0
    offline = capsys.readouterr().out
    assert transcribe_main(options + ["--stream", "--chunk-ms", "160"]) == 0
    assert capsys.readouterr().out == offline


def test_a_model_trained_on_adaptive_cmvn_exports_to_onnx_and_transcribes_as_its_checkpoint(causal_adaptive,
                                                                                              tmp_path):
    """The export keeps the config's prior; the torch-free runtime's transcripts are the checkpoint's, file by file and
    streamed in 80 ms chunks. Transforms the runtime does not have are refused, named."""
    from ssm_fairseq.deploy.exporter import UnsupportedModelError, export_checkpoint
    from ssm_fairseq.deploy.recognizer import OnnxRecognizer
    data, checkpoint, files = causal_adaptive
    export_checkpoint(checkpoint, tmp_path / "exported")
    runtime = OnnxRecognizer(tmp_path / "exported", **SEARCH)
    assert runtime.model.metadata["adaptive_cmvn"] == {"prior_frames": 50.0}
    expected = Recognizer(checkpoint, device="cpu", **SEARCH).transcribe(files)
    assert runtime.transcribe(files) == expected
    stream = runtime.stream()
    assert [stream.stream_file(f, 80).text for f in files] == expected
    recognizer = Recognizer(checkpoint, device="cpu")
    recognizer.feature_transforms.transforms.append(recognizer.feature_transforms.transforms[-1])
    with pytest.raises(UnsupportedModelError, match=r"\['GlobalCMVN', 'AdaptiveCMVN', 'AdaptiveCMVN'\]"):
        checkpoint_metadata(recognizer)
