"""StreamingTranscriber and ssm-transcribe --stream: a causal model trained on global CMVN transcribes the same
streamed, in any chunks, as offline; models and data that need the whole utterance are refused.

A tiny causal model (``--causal-encoder``) is trained for two epochs on 12 utterances of the shipped mini corpus
prepared with ``--cmvn global``, as ``conf/mini_streaming.sh`` prepares and trains.
"""
from __future__ import annotations

import logging
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import yaml
from fairseq.data.audio.data_cfg import S2TDataConfig
from fairseq.data.audio.feature_transforms import CompositeAudioFeatureTransform
from fairseq.data.audio.feature_transforms.global_cmvn import GlobalCMVN

from ssm_fairseq.asr import Recognizer
from ssm_fairseq.asr.features.transforms import NonFiniteFeaturesError
from ssm_fairseq.asr.features.audio_features import AudioError
from ssm_fairseq.integrity.checkpoint_checks import FeatureMismatchError, feature_fingerprint
from ssm_fairseq.asr.streaming_transcriber import (ConcurrentCallError, SampleRangeError, StreamingTranscriber,
                                               StreamInProgressError)
from ssm_fairseq.transcribe import PRECISIONS, InputError, Transcriber
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


def test_two_streams_interleaved_through_one_loaded_model_each_equal_offline(causal):
    """One ``Recognizer`` (one loaded model), two ``Stream``s fed two files chunk by chunk in turn, in chunks of
    different sizes: each final transcript and its word times are its file's offline ones."""
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", **SEARCHES["beam"])
    offline = recognizer.transcribe(files[:2], timestamps=True)
    streams = [recognizer.stream(timestamps=True) for _ in files[:2]]
    audio = [sf.read(str(path), dtype="float32")[0] for path in files[:2]]
    chunks = [[a[i:i + size] for i in range(0, len(a), size)] for a, size in zip(audio, (2560, 4000))]
    for n in range(max(map(len, chunks))):
        for stream, path, pieces in zip(streams, files, chunks):
            if n < len(pieces):
                stream.accept_waveform(pieces[n], source=path.name)
    finals = [stream.finish() for stream in streams]
    assert [t.text for t in finals] == [t.text for t in offline] and all(t.text for t in finals)
    for streamed, whole in zip(finals, offline):
        assert [w.word for w in streamed.words] == [w.word for w in whole.words]
        assert [t for w in streamed.words for t in w[1:]] == pytest.approx([t for w in whole.words for t in w[1:]])


def test_streams_of_one_recognizer_run_in_threads_at_once(causal):
    """Each thread streams its own file on its own ``Stream`` of the one recognizer: no call is refused, nothing
    is mixed, each transcript is its file's offline one."""
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", **SEARCHES["greedy"])
    results: dict[Path, str] = {}
    threads = [threading.Thread(target=lambda path=path: results.update(
        {path: recognizer.stream().stream_file(path, 160).text})) for path in files]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [results.get(path) for path in files] == recognizer.transcribe(files)


def test_features_not_finite_after_the_transforms_are_refused_streamed_as_offline(causal, tmp_path):
    """The one check of ``asr.features.transformed``: a transform that makes inf (global CMVN with a zero standard
    deviation) is refused offline naming the file, and in a stream (naming the file in ``stream_file``)."""
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", **SEARCHES["greedy"])
    zero_std = tmp_path / "zero_std.npz"
    np.savez(zero_std, mean=np.zeros(80, dtype=np.float32), std=np.zeros(80, dtype=np.float32))
    recognizer.feature_transforms = CompositeAudioFeatureTransform([GlobalCMVN(str(zero_std))])  # x / 0
    stream = recognizer.stream()  # after the swap: a stream takes its transforms' state when its utterance starts
    with pytest.raises(AudioError, match=f"^{re.escape(str(files[0]))}: features are not finite"):
        recognizer.transcribe(files[:1])
    samples, _ = sf.read(str(files[0]), dtype="float32")
    with pytest.raises(NonFiniteFeaturesError, match="^features are not finite"):
        stream.accept_waveform(samples[:8000])
    stream.reset()
    with pytest.raises(AudioError, match=f"^{re.escape(str(files[0]))}: features are not finite"):
        stream.stream_file(files[0], 320)


def _offline(stream: StreamingTranscriber, path: Path) -> str:
    return stream.offline.transcribe([path])[0]


def test_another_source_or_a_second_stream_before_finish_is_refused(causal):
    """Chunks of two sources on one object (named by ``source``), and ``stream_file`` during a stream of
    ``accept_waveform`` chunks, are refused; the stream in progress goes on unharmed."""
    data, checkpoint, files = causal
    stream = StreamingTranscriber(checkpoint, device="cpu", **SEARCHES["beam"])
    a, _ = sf.read(str(files[0]), dtype="float32")
    b, _ = sf.read(str(files[1]), dtype="float32")
    stream.accept_waveform(a[:8000], source="a")
    with pytest.raises(StreamInProgressError, match=r"accept_waveform\(source='b'\): the stream in progress is "
                                                    r"0\.50 s accepted, source 'a', not finished"):
        stream.accept_waveform(b[:8000], source="b")
    with pytest.raises(StreamInProgressError, match="accept_waveform.source=None.: the stream in progress"):
        stream.accept_waveform(a[8000:9000])
    with pytest.raises(StreamInProgressError, match=f"stream_file.'{files[1]}'.: a stream is in progress"):
        stream.stream_file(files[1], 320)
    stream.accept_waveform(a[8000:], source="a")
    assert stream.finish().text == _offline(stream, files[0])
    stream.accept_waveform(b)  # finish() ended it: a new stream, any source
    stream.reset()  # discarded: stream_file may start
    assert stream.stream_file(files[1], 320).text == _offline(stream, files[1])


def test_a_call_while_another_runs_is_refused_not_mixed(causal):
    """A call from another thread during ``stream_file`` (held inside its ``on_partial`` callback), and a call from
    the callback itself, raise ``ConcurrentCallError``; the running stream's transcript is the offline one."""
    data, checkpoint, files = causal
    stream = StreamingTranscriber(checkpoint, device="cpu", **SEARCHES["beam"])
    samples, _ = sf.read(str(files[1]), dtype="float32")
    inside, release, results, reentrant = threading.Event(), threading.Event(), [], []

    def held(seconds: float, text: str) -> None:
        if not inside.is_set():
            with pytest.raises(ConcurrentCallError) as error:
                stream.accept_waveform(samples[:1600])
            reentrant.append(str(error.value))
            inside.set()
            release.wait(60)

    worker = threading.Thread(target=lambda: results.append(stream.stream_file(files[0], 320, held)), name="worker")
    worker.start()
    assert inside.wait(60)
    try:
        for call in (lambda: stream.accept_waveform(samples[:1600]), stream.finish, stream.reset,
                     lambda: stream.stream_file(files[1], 320)):
            with pytest.raises(ConcurrentCallError, match="while stream_file is running in thread 'worker', from "
                                                          "thread 'MainThread'"):
                call()
    finally:
        release.set()
        worker.join()
    assert "while stream_file is running from inside it (an on_partial callback?)" in reentrant[0]
    assert results[0].text == _offline(stream, files[0])
    assert stream.stream_file(files[1], 320).text == _offline(stream, files[1])  # free again


def test_float_samples_beyond_one_are_refused_naming_the_peak(causal):
    """16-bit values as floats (``w * 32768``) are refused, as float16 / bfloat16 tensors too; the chunk is not
    taken and the stream goes on."""
    data, checkpoint, files = causal
    stream = StreamingTranscriber(checkpoint, device="cpu", **SEARCHES["greedy"])
    samples, _ = sf.read(str(files[0]), dtype="float32")
    stream.accept_waveform(samples[:4000])
    peak = int(abs(samples[4000:8000]).argmax())
    for scaled in (samples[4000:8000] * 32768, torch.from_numpy(samples[4000:8000] * 32768).bfloat16()):
        with pytest.raises(SampleRangeError, match=rf"float samples in \[-1, 1\]; this chunk reaches -?[\d.e+]+ \(at "
                                                   rf"stream sample {4000 + peak}\): .* divide them by 32768"):
            stream.accept_waveform(scaled)
    assert stream.seconds_accepted == 0.25
    stream.accept_waveform(samples[4000:])
    assert stream.finish().text == _offline(stream, files[0])


def test_chunk_lengths_are_float_milliseconds(causal, capsys):
    data, checkpoint, files = causal
    stream = StreamingTranscriber(checkpoint, device="cpu", **SEARCHES["greedy"])
    expected = _offline(stream, files[0])
    assert stream.stream_file(files[0], 320.0).text == expected
    assert stream.stream_file(files[0], 12.5).text == expected  # 200 samples
    for bad in (0, -320.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"chunk_ms must be a positive, finite number of milliseconds, got {bad}"):
            stream.stream_file(files[0], bad)
    with pytest.raises(ValueError, match="chunk_ms must be a number of milliseconds, got '320'"):
        stream.stream_file(files[0], "320")
    options = ["--checkpoint", str(checkpoint), "--beam", "1", "--max-symbols-per-frame", "2", "--blank-penalty", "20",
               "--cpu", "--stream"]
    assert transcribe_main([str(files[0]), *options, "--chunk-ms", "12.5"]) == 0
    assert capsys.readouterr().out == f"{files[0]}\t{expected}\n"
    with pytest.raises(SystemExit):
        transcribe_main([str(files[0]), *options, "--chunk-ms", "nan"])
    assert "--chunk-ms: chunk_ms must be a positive, finite number of milliseconds, got nan" in capsys.readouterr().err


def test_timestamps_a_config_cannot_give_are_refused_when_asked_for(causal, tmp_path):
    """A pre-tokenizer rewrites the decoded words, so they cannot be timed: refused at construction, with the
    reason, not at the end of a stream as an audio error."""
    data, checkpoint, files = causal
    tokenized = tmp_path / "data"
    shutil.copytree(data, tokenized)
    config = tokenized / "config.yaml"
    config.write_text(yaml.safe_dump(dict(yaml.safe_load(config.read_text()), pre_tokenizer={"tokenizer": "space"})))
    with pytest.raises(ValueError, match="timestamps time the words of the SentencePiece text; this config's "
                                         "pre_tokenizer .* rewrites them") as error:
        StreamingTranscriber(checkpoint, data_dir=tokenized, device="cpu", timestamps=True)
    assert not isinstance(error.value, AudioError)
    stream = StreamingTranscriber(checkpoint, data_dir=tokenized, device="cpu", **SEARCHES["greedy"])
    assert stream.stream_file(files[0], 320).words == []


def test_the_last_partial_result_is_the_final_transcript(causal):
    """Beam search's partial transcript ranks its hypotheses as the final one does (length-normalised), so with
    every encoder frame complete (audio cut to whole sub-sampling groups: ``finish`` adds no frame) the partial
    result after the last chunk is the final transcript. Ranked by score alone, it was the empty hypothesis on 3 of
    these 4 files at beam 4."""
    data, checkpoint, files = causal
    stream = StreamingTranscriber(checkpoint, device="cpu", beam=4)
    stride = round(stream.offline.frame_seconds * 100)  # feature frames per encoder frame
    finals = []
    for path in files:
        samples, _ = sf.read(str(path), dtype="float32")
        frames = 1 + (len(samples) - 400) // 160
        frames -= frames % stride
        partials = [stream.accept_waveform(samples[start:start + 3200])
                    for start in range(0, 400 + 160 * (frames - 1), 3200)]
        finals.append(stream.finish().text)
        assert partials[-1] == finals[-1]
    assert any(finals)


def test_bfloat16_streaming_rounds_as_much_as_offline(causal):
    """In float32 the streamed encoder output equals the offline one to float32 rounding (hence the same
    transcripts); in bfloat16 both round to 8 significant bits, differently, and the streamed output is about as far
    from the float32 one as the offline bfloat16 output is (each about 0.5%): a bfloat16 stream carries no extra
    error, and its transcript may differ from the offline bfloat16 one as that differs from float32's."""
    data, checkpoint, files = causal
    encoders = {precision: StreamingTranscriber(checkpoint, device="cpu", precision=precision).offline
                for precision in ("float32", "bfloat16")}

    def encoded(precision: str, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        encoder = encoders[precision].model.encoder
        x = features.to(PRECISIONS[precision]).unsqueeze(0)
        with torch.no_grad():
            whole = encoder(x, torch.tensor([x.shape[1]]))["encoder_out"]
            cache: dict = {}
            chunks = [encoder.step(x[:, i:i + 32], cache) for i in range(0, x.shape[1], 32)]
            chunks.append(encoder.step(x[:, :0], cache, final=True))
        return whole.float(), torch.cat(chunks, 1).float()

    def relative(a: torch.Tensor, b: torch.Tensor) -> float:
        return ((a - b).norm() / b.norm()).item()

    for path in files[:2]:
        features = encoders["float32"].features(path)
        reference, streamed32 = encoded("float32", features)
        offline16, streamed16 = encoded("bfloat16", features)
        assert relative(streamed32, reference) < 1e-5
        assert 1e-3 < relative(offline16, reference) < 1e-2 and 1e-3 < relative(streamed16, offline16) < 1e-2
        assert relative(streamed16, reference) < 1.5 * relative(offline16, reference)


def test_a_file_too_long_for_one_window_with_a_causal_model_is_transcribed_as_its_stream(causal, tmp_path):
    """A 61 s file (more than the model's 60 s; refused before long files were windowed): a causal model's long
    file goes through the encoder's step, so offline transcription equals streaming the file."""
    data, checkpoint, files = causal
    long = tmp_path / "long.flac"
    sf.write(long, np.random.default_rng(0).uniform(-0.1, 0.1, 61 * 16000).astype(np.float32), 16000)
    transcriber = Transcriber(checkpoint, device="cpu", beam=1)
    assert transcriber.transcribe([long]) == [transcriber.stream().stream_file(long, 1000).text]


def test_stream_file_logs_a_conversion_to_16khz_mono(causal, tmp_path, caplog):
    data, checkpoint, files = causal
    samples, rate = sf.read(str(files[0]), dtype="float32")
    stereo = tmp_path / "stereo.flac"
    sf.write(stereo, np.stack([samples, samples], axis=1), rate)
    stream = StreamingTranscriber(checkpoint, device="cpu", **SEARCHES["greedy"])
    with caplog.at_level(logging.INFO, logger="ssm_fairseq.asr"):
        assert stream.stream_file(stereo, 320).text == stream.stream_file(files[0], 320).text
    assert [r.getMessage() for r in caplog.records if r.name == "ssm_fairseq.asr"] == [
        f"{stereo}: not 16 kHz mono: 2 channels downmixed (to 16 kHz mono)"]
