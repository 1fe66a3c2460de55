"""A stream cut at pauses starts each segment where its sound starts (``pause_segments.pause_ends_quiet``, the
stream's samples given to ``CausalQuietness``): on real utterances joined with pauses of faint noise, the segments
after a pause start at the offline pieces' first frames, the same at every chunk size."""
from __future__ import annotations

import numpy as np
import soundfile as sf

from ssm_fairseq.asr import Recognizer
from ssm_fairseq.asr.endpoints import EndpointRules
from ssm_fairseq.asr.features.audio_features import log_mel_filterbank
from ssm_fairseq.asr.features.filterbank import StreamingFilterbank
from ssm_fairseq.asr.pause_segments import CausalQuietness, frame_levels_db, pauses, speech_segments

from test_streaming_transcriber import causal  # noqa: F401  (the trained model's fixture)
from test_transcribe import _one_thread  # noqa: F401  (an autouse fixture)

RATE = 16000
MIN_PAUSE = 0.5


def _joined(files) -> np.ndarray:
    """The files' audio, each followed by 1 s of 16-bit noise (one step's standard deviation)."""
    rng = np.random.default_rng(0)
    pieces = []
    for path in files:
        noise = (np.round(rng.normal(0, 1, RATE)) / 32768).astype(np.float32)
        pieces += [sf.read(str(path), dtype="float32")[0], noise]
    return np.concatenate(pieces)


def test_segments_after_pauses_start_where_the_offline_pieces_do_at_every_chunk_size(causal):  # noqa: F811
    data, checkpoint, files = causal
    recognizer = Recognizer(checkpoint, device="cpu", beam=2)
    samples = _joined(files[:3])
    fbank = StreamingFilterbank().accept_waveform(samples)
    window = lambda i: samples[160 * i:160 * i + 400]  # noqa: E731
    looked, unlooked = CausalQuietness().quiet(fbank, samples), CausalQuietness().quiet(fbank)
    assert pauses(looked, 50) != pauses(unlooked, 50)  # the rule moves some pause's end in these recordings
    offline = speech_segments(frame_levels_db(log_mel_filterbank(samples, RATE)), MIN_PAUSE, 10 ** 6, window)
    streamed = []
    for chunk_ms in (80, 320, 1000):
        stream = recognizer.stream(endpoints=EndpointRules(pause_seconds=MIN_PAUSE, blank_rules=False))
        for start in range(0, len(samples), chunk_ms * 16):
            stream.accept_waveform(samples[start:start + chunk_ms * 16])
        streamed.append([(round(s.start, 6), round(s.end, 6), s.text) for s in stream.finish_segments()])
        assert streamed[-1] == streamed[0], chunk_ms
    starts = [start for start, _, text in streamed[0]]
    assert len(starts) == len(offline) == 3, (streamed[0], offline)
    np.testing.assert_allclose(starts[1:], [start / 100 for start, _ in offline[1:]], atol=1e-6)
