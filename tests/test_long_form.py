"""Files of any length offline (``ssm_fairseq.asr.long_form``), on tiny models trained for two epochs: a file within
one window decodes exactly as before; windows stitch to one encoder output that one search takes; a file longer
than the model's 60 s is transcribed; a causal model's long file is its stream.

Where a bidirectional window's centre frames can equal whole-file encoding exactly (an encoder whose frames see
only their own filterbank frames: the ``tr`` sub-sampler without layers), they do, wherever the windows are cut.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from ssm_fairseq.asr import Recognizer
from ssm_fairseq.asr.features.audio_features import AudioError
from ssm_fairseq.asr.features.audio_spans import AudioSpans
from ssm_fairseq.asr.long_form import WindowedEncoder, transcribe_long
from ssm_fairseq.asr.pause_segments import frame_levels_db, speech_segments
from ssm_fairseq.asr.windowing import Windowing
from ssm_fairseq.asr.offline import transcribe_files

from cli import REPO
from test_transcribe import _one_thread, train_tiny  # noqa: F401  (_one_thread: an autouse fixture)

pytestmark = pytest.mark.slow

# A blank penalty far above the logits' spread makes the tiny models emit labels, so no transcript is empty.
SEARCH = {"beam": 3, "max_symbols_per_frame": 2, "blank_penalty": 20.0}
TEST_LARGE = REPO / "recipes/librispeech/mini/LibriSpeech/test-large/101/1022"


def _recording(path: Path, seconds: float) -> Path:
    """Consecutive test-large utterances with 0.3 s pauses, repeated to ``seconds``, written to ``path``."""
    pause = np.zeros(4800, dtype=np.float32)
    speech = np.concatenate([np.concatenate([sf.read(f, dtype="float32")[0], pause])
                             for f in sorted(TEST_LARGE.glob("*.flac"))[:10]])
    sf.write(path, np.resize(speech, int(seconds * 16000)), 16000)
    return path


@pytest.fixture(scope="module")
def bidirectional(tmp_path_factory) -> Recognizer:
    """A tiny ``mssm_transducer`` (utterance CMVN) trained for two epochs."""
    checkpoints = train_tiny(tmp_path_factory.mktemp("bidirectional"), 2)
    return Recognizer(checkpoints / "checkpoint_last.pt", device="cpu", **SEARCH)


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> dict[float, Path]:
    root = tmp_path_factory.mktemp("recordings")
    return {seconds: _recording(root / f"{seconds}.flac", seconds) for seconds in (9.5, 23.9, 64.5)}


def _whole_file_encoding(recognizer: Recognizer, path: Path) -> torch.Tensor:
    """``1 x T' x D``: the encoder on the whole file's features, as ``TransducerGenerator`` runs it."""
    features = recognizer.features(path).unsqueeze(0)
    with torch.no_grad():
        return recognizer.model.encoder(features, torch.tensor([features.shape[1]]))["encoder_out"]


def test_a_file_within_one_window_decodes_as_offline_transcription(bidirectional, recordings):
    path = recordings[9.5]
    windowing = Windowing(window_seconds=10, window_context_seconds=2)
    encoded = list(WindowedEncoder(bidirectional, AudioSpans(path), windowing))
    assert len(encoded) == 1 and torch.equal(encoded[0], _whole_file_encoding(bidirectional, path))
    expected = bidirectional.transcribe([path], timestamps=True)[0]
    assert expected.text
    assert transcribe_long(bidirectional, path, windowing, timestamps=True) == expected
    assert transcribe_files(bidirectional, [path], True, windowing) == [expected]


@pytest.mark.parametrize("window_seconds, context_seconds", [(4, 0), (4, 1.2), (7.37, 0.52), (10, 4.96)])
def test_windows_stitch_to_the_whole_file_encoding_where_frames_see_only_their_own(
        bidirectional, recordings, window_seconds, context_seconds):
    """With the encoder's layers removed, each encoder frame is made of its own 4 filterbank frames (``tr``): the
    stitched centres must then be the whole file's encoder output, frame for frame, wherever the windows fall (the
    file's utterance CMVN taken over the whole file: ``window_cmvn="file"``)."""
    path = recordings[23.9]
    windowing = Windowing(window_seconds, context_seconds, window_cmvn="file")
    encoder = WindowedEncoder(bidirectional, AudioSpans(path), windowing)
    assert len(encoder.windows) > 2
    layers, bidirectional.model.encoder.layers = bidirectional.model.encoder.layers, torch.nn.ModuleList()
    try:
        stitched = torch.cat(list(encoder), dim=1)
        whole = _whole_file_encoding(bidirectional, path)
    finally:
        bidirectional.model.encoder.layers = layers
    assert stitched.shape == whole.shape
    assert (stitched - whole).abs().max() < 1e-4


def test_windows_with_more_context_come_closer_to_whole_file_encoding(bidirectional, recordings):
    path = recordings[23.9]
    whole = _whole_file_encoding(bidirectional, path)
    differences = []
    for context in (0, 1, 4):
        for cmvn in ("file", "window"):
            encoded = torch.cat(list(WindowedEncoder(bidirectional, AudioSpans(path),
                                                     Windowing(10, context, cmvn))), dim=1)
            assert encoded.shape == whole.shape
            differences.append((encoded - whole).abs().max().item())
    assert differences[4] < differences[0] / 5 and differences[5] < differences[1]
    assert 0 < min(differences)


def test_one_search_takes_the_windows_as_it_takes_their_concatenation(bidirectional, recordings):
    path = recordings[23.9]
    windowing = Windowing(window_seconds=6, window_context_seconds=1)
    stitched = torch.cat(list(WindowedEncoder(bidirectional, AudioSpans(path), windowing)), dim=1)
    search = bidirectional.generator.search(1, torch.device("cpu"))
    search.advance(stitched)
    (best,), = search.finish(1, bidirectional.generator.length_norm)
    timed = transcribe_long(bidirectional, path, windowing, timestamps=True)
    assert timed.text == bidirectional.text(best.tokens) and timed.text
    assert timed.words == bidirectional.timed_words(best.tokens, best.frames, AudioSpans(path).duration)


def test_a_file_longer_than_the_model_takes_is_transcribed_with_timed_words(bidirectional, recordings, tmp_path):
    """64.5 s: more than the 6000 frames the model takes, in three 30 s windows; short files beside it are batched
    as before, and every transcript comes back in the order of the paths."""
    long, short = recordings[64.5], recordings[9.5]
    texts = bidirectional.transcribe([short, long, short], timestamps=True)
    assert texts[0] == texts[2] == bidirectional.transcribe([short], timestamps=True)[0]
    timed = texts[1]
    assert timed.text.split() == [w.word for w in timed.words] and len(timed.words) > 20
    assert 0 <= timed.words[0].start and timed.words[-1].end <= 64.5
    assert timed.words[-1].start > 40  # frames are counted from the file's start, across windows
    assert all(a.start <= b.start for a, b in zip(timed.words, timed.words[1:]))


def test_non_finite_audio_in_a_later_window_is_named_with_its_seconds(bidirectional, recordings, tmp_path):
    samples, _ = sf.read(recordings[23.9], dtype="float32")
    samples[20 * 16000] = np.nan
    broken = tmp_path / "broken.wav"
    sf.write(broken, samples, 16000, subtype="FLOAT")
    with pytest.raises(AudioError, match=re.escape(f"{broken}: features are not finite (NaN or inf in the audio) "
                                                   "(seconds 12.00 to 20.00)")):  # the first window holding it
        transcribe_long(bidirectional, broken, Windowing(window_seconds=8, window_context_seconds=1))


def test_a_causal_models_long_file_is_its_stream(tmp_path, recordings):
    checkpoints = train_tiny(tmp_path, 1, "mssm_transducer_streaming", ("--cmvn", "global"))
    recognizer = Recognizer(checkpoints / "checkpoint_last.pt", device="cpu", **SEARCH)
    path = recordings[23.9]
    streamed = recognizer.stream(timestamps=True).stream_file(path, 1000)
    (windowed,) = transcribe_files(recognizer, [path], True, Windowing(window_seconds=7, window_context_seconds=2))
    assert windowed.text == streamed.text and windowed.text
    assert [w.word for w in windowed.words] == [w.word for w in streamed.words]
    assert [t for w in windowed.words for t in w[1:]] == pytest.approx([t for w in streamed.words for t in w[1:]])


def test_a_recording_cut_at_pauses_is_its_pieces_transcribed_one_at_a_time(bidirectional, tmp_path):
    """``Windowing(pause_seconds=...)``: the pieces between the pauses (``pause_segments``), written out as files
    and transcribed one at a time, give the recording's transcript, joined, and its words, shifted by each piece's
    start; silence between them is not transcribed."""
    rng = np.random.default_rng(0)
    utterances = [sf.read(f, dtype="float32")[0] for f in sorted(TEST_LARGE.glob("*.flac"))[:3]]
    pause = lambda: rng.normal(0, 1 / 32768, 16000).astype(np.float32)  # noqa: E731  (1 s of faint noise)
    recording = tmp_path / "joined.wav"
    sf.write(recording, np.concatenate([pause(), *[x for u in utterances for x in (u, pause())]]), 16000,
             subtype="PCM_16")
    windowing = Windowing(pause_seconds=0.5)
    (cut,) = transcribe_files(bidirectional, [recording], True, windowing)
    samples = sf.read(recording, dtype="float32")[0]
    levels = frame_levels_db(AudioSpans(recording).filterbank(0, AudioSpans(recording).frames))
    segments = speech_segments(levels, 0.5, 3000)
    assert len(segments) == 3
    pieces = []
    for n, (start, end) in enumerate(segments):  # filterbank frames start..end-1: samples 160 start to 160 end + 240
        pieces.append(tmp_path / f"piece{n}.wav")
        sf.write(pieces[-1], samples[160 * start:160 * end + 240], 16000, subtype="FLOAT")
    alone = bidirectional.transcribe(pieces, timestamps=True)
    assert cut.text == " ".join(piece.text for piece in alone if piece.text) and cut.text
    shifted = [(w.word, w.start + start / 100, w.end + start / 100) for piece, (start, _) in zip(alone, segments)
               for w in piece.words]
    assert [w.word for w in cut.words] == [word for word, _, _ in shifted]
    assert [t for w in cut.words for t in w[1:]] == pytest.approx([t for w in shifted for t in w[1:]], abs=0.011)
    assert bidirectional.transcribe([recording]) != [cut.text]  # whole, the recording transcribes otherwise
    assert transcribe_files(bidirectional, [recording], False, windowing) == [cut.text]
