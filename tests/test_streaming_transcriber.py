"""StreamingTranscriber and ssm-transcribe --stream: a causal model trained on global CMVN transcribes the same
streamed, in any chunks, as offline; models and data that need the whole utterance are refused.

A tiny causal model (``--causal-encoder``) is trained for two epochs on 12 utterances of the shipped mini corpus
prepared with ``--cmvn global``, as ``conf/mini_streaming.sh`` prepares and trains.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import soundfile as sf
import torch
import yaml
from fairseq.data.audio.data_cfg import S2TDataConfig

from ssm_fairseq.checkpoint_checks import FeatureMismatchError, feature_fingerprint
from ssm_fairseq.streaming.transcriber import StreamingTranscriber
from ssm_fairseq.transcribe import Transcriber
from ssm_fairseq.transcribe import main as transcribe_main

from test_transcribe import _one_thread, train_tiny  # noqa: F401  (_one_thread: an autouse fixture)

pytestmark = pytest.mark.slow

# A blank penalty far above the logits' spread makes the tiny model emit labels, so no transcript compared is empty.
SEARCHES = {"greedy": {"beam": 1, "max_symbols_per_frame": 2, "blank_penalty": 20.0},
            "beam": {"beam": 3, "max_symbols_per_frame": 2, "blank_penalty": 20.0}}


@pytest.fixture(scope="module")
def causal(tmp_path_factory) -> tuple[Path, Path, list[Path]]:
    """(data directory, checkpoint of a causal model trained on global CMVN, 4 test-mini files)."""
    root = tmp_path_factory.mktemp("streaming")
    corpus, data = root / "LibriSpeech", root / "data"
    checkpoints = train_tiny(root, 4, "mssm_transducer_streaming", ("--cmvn", "global"))
    return data, checkpoints / "checkpoint_last.pt", sorted(corpus.glob("test-mini/*/*/*.flac"))


@pytest.mark.parametrize("search", sorted(SEARCHES))
def test_streamed_in_any_chunks_equals_offline(causal, search):
    data, checkpoint, files = causal
    stream = StreamingTranscriber(checkpoint, device="cpu", timestamps=True, **SEARCHES[search])
    offline = stream.offline.transcribe(files, timestamps=True)
    assert all(t.text for t in offline)
    for chunk_ms in (10, 320, 1000):  # 10 ms: less than a filterbank window
        partials = []
        streamed = [stream.stream_file(path, chunk_ms, lambda seconds, text: partials.append((seconds, text)))
                    for path in files]
        assert [t.text for t in streamed] == [t.text for t in offline]
        for s, o in zip(streamed, offline):
            assert [w.word for w in s.words] == [w.word for w in o.words]
            assert [t for w in s.words for t in w[1:]] == pytest.approx([t for w in o.words for t in w[1:]])
        assert partials and all(text for _, text in partials)  # partial results appeared as the audio went on


def test_partial_results_grow_as_the_audio_arrives(causal):
    data, checkpoint, files = causal
    stream = StreamingTranscriber(checkpoint, device="cpu", **SEARCHES["greedy"])
    samples, rate = sf.read(str(files[0]), dtype="float32")
    assert rate == 16000
    partials = [stream.accept_waveform(samples[start:start + 2560]) for start in range(0, len(samples), 2560)]
    final = stream.finish().text
    assert partials[0] == "" or final.startswith(partials[0].split()[0])
    assert [len(p.split()) for p in partials] == sorted(len(p.split()) for p in partials)  # greedy never retracts
    assert final.startswith(partials[-1].rsplit(" ", 1)[0])
    # finish() starts a new stream: the same audio again gives the same transcript
    stream.accept_waveform(samples)
    assert stream.finish().text == final


def test_cli_stream_prints_partials_to_stderr_and_the_offline_lines(causal, capsys):
    data, checkpoint, files = causal
    options = ["--checkpoint", str(checkpoint), "--beam", "1", "--max-symbols-per-frame", "2", "--blank-penalty", "20",
               "--cpu"]
    assert transcribe_main([*map(str, files), *options]) == 0
    offline = capsys.readouterr().out
    assert transcribe_main([*map(str, files), *options, "--stream", "--chunk-ms", "160"]) == 0
    captured = capsys.readouterr()
    assert captured.out == offline
    assert f"{files[0]} [" in captured.err  # partial results as they change, with their audio time


def test_models_and_data_that_need_the_whole_utterance_are_refused(causal, tmp_path, capsys):
    """A causal model trained on utterance CMVN (here: the causal checkpoint with the fingerprint of a data directory
    switched to utterance CMVN, as training there records it) cannot stream; the model trained on global CMVN is
    refused on that directory before, as any model on features other than its own."""
    data, checkpoint, files = causal
    utterance_cmvn = tmp_path / "data"
    shutil.copytree(data, utterance_cmvn)
    config = utterance_cmvn / "config.yaml"
    settings = yaml.safe_load(config.read_text())
    settings["feature_transforms"] = {"_train": ["utterance_cmvn"], "*": ["utterance_cmvn"]}
    del settings["global_cmvn"]
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    with pytest.raises(FeatureMismatchError, match=f"global CMVN from {data}/gcmvn.npz in the checkpoint"):
        StreamingTranscriber(checkpoint, data_dir=utterance_cmvn, device="cpu")
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    state["cfg"]["model"]["dictionary_fingerprint"]["features"] = feature_fingerprint(S2TDataConfig(config))
    trained_there = tmp_path / "trained_on_utterance_cmvn.pt"
    torch.save(state, trained_there)
    with pytest.raises(ValueError, match="UtteranceCMVN, which needs the whole utterance") as error:
        StreamingTranscriber(trained_there, data_dir=utterance_cmvn, device="cpu")
    assert not isinstance(error.value, FeatureMismatchError)
    capsys.readouterr()
    assert transcribe_main([str(files[0]), "--checkpoint", str(trained_there), "--data-dir", str(utterance_cmvn),
                            "--stream", "--cpu"]) == 1
    assert "UtteranceCMVN, which needs the whole utterance" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --chunk-ms without --stream: a usage error
        transcribe_main([str(files[0]), "--checkpoint", str(checkpoint), "--chunk-ms", "160"])
