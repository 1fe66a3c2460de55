"""ssm_fairseq.asr.features.filterbank: chunk-by-chunk filterbanks equal the offline ones.

Compared to 1e-5 (absolute, on log energies of about -15..25), not bit for bit: the mel projection inside
torchaudio's ``fbank`` is one matrix product over all the frames of a call, and the BLAS kernel (hence the float32
rounding, about 1e-6 here) depends on how many frames the call has. Everything else is per frame and exact.
"""
import numpy as np
import pytest
import torch

from ssm_fairseq.asr.features.audio_features import log_mel_filterbank
from ssm_fairseq.asr.features.filterbank import StreamingFilterbank

TOLERANCE = 1e-5


def waveform(seconds: float, seed: int = 0) -> np.ndarray:
    """A tone with noise and a DC offset, in [-1, 1]: every frame's DC removal and pre-emphasis matter."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    samples = 0.4 * np.sin(2 * np.pi * 440 * t) + 0.1 * rng.standard_normal(t.size) + 0.05
    return np.clip(samples, -1, 1).astype(np.float32)


def stream(samples: np.ndarray, sizes) -> tuple[np.ndarray, StreamingFilterbank]:
    fbank, pieces, start = StreamingFilterbank(), [], 0
    for size in sizes:
        frames = fbank.accept_waveform(samples[start:start + size])
        assert frames.dtype == np.float32 and frames.ndim == 2 and frames.shape[1] == 80
        assert fbank.pending_samples < 400
        pieces.append(frames)
        start += size
        if start >= samples.size:
            break
    return np.concatenate(pieces), fbank


@pytest.mark.parametrize("chunk", [1, 160, 401, 5120])
def test_fixed_chunks_give_the_offline_frames(chunk):
    samples = waveform(0.5 if chunk == 1 else 1.3)  # 1-sample chunks: one call per sample, kept short
    offline = log_mel_filterbank(samples, 16000)
    frames, fbank = stream(samples, [chunk] * samples.size)
    assert frames.shape == offline.shape
    np.testing.assert_allclose(frames, offline, rtol=0, atol=TOLERANCE)
    assert fbank.frames_emitted == offline.shape[0] and fbank.samples_accepted == samples.size


def test_random_chunks_and_tensors_give_the_offline_frames():
    samples = waveform(1.7, seed=1)
    offline = log_mel_filterbank(samples, 16000)
    sizes = np.random.default_rng(2).integers(0, 700, size=samples.size).tolist()  # 0 included: an empty chunk
    frames, _ = stream(samples, sizes)
    np.testing.assert_allclose(frames, offline, rtol=0, atol=TOLERANCE)
    fbank = StreamingFilterbank()
    as_tensors = np.concatenate([fbank.accept_waveform(torch.from_numpy(samples[i:i + 999]).double())
                                 for i in range(0, samples.size, 999)])  # float32 -> float64 -> float32: exact
    np.testing.assert_allclose(as_tensors, offline, rtol=0, atol=TOLERANCE)


def test_frames_appear_as_their_window_completes_and_reset_starts_over():
    samples = waveform(0.1)
    fbank = StreamingFilterbank()
    assert fbank.accept_waveform(samples[:399]).shape == (0, 80)  # shorter than one 25 ms window: nothing
    assert fbank.frames_emitted == 0 and fbank.pending_samples == 399
    assert fbank.accept_waveform(samples[399:400]).shape == (1, 80)  # frame 0: samples [0, 400)
    assert fbank.accept_waveform(samples[400:559]).shape == (0, 80)
    assert fbank.accept_waveform(samples[559:560]).shape == (1, 80)  # frame 1: samples [160, 560)
    assert fbank.pending_samples == 400 - 160
    fbank.reset()
    assert fbank.frames_emitted == 0 and fbank.samples_accepted == 0
    np.testing.assert_allclose(fbank.accept_waveform(samples[:400]), log_mel_filterbank(samples[:400], 16000),
                               rtol=0, atol=TOLERANCE)


def test_a_caller_reusing_its_buffer_does_not_change_the_frames():
    samples = waveform(0.2)
    fbank, reused, pieces = StreamingFilterbank(), np.zeros(100, dtype=np.float32), []
    for start in range(0, samples.size, 100):
        reused[:] = samples[start:start + 100]
        pieces.append(fbank.accept_waveform(reused))
    np.testing.assert_allclose(np.concatenate(pieces), log_mel_filterbank(samples, 16000), rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("bad, named", [
    (np.zeros((400, 2), dtype=np.float32), "1-D mono samples, got shape (400, 2)"),
    (np.float32(0.5), "1-D mono samples, got shape ()"),
    (np.zeros(400, dtype=np.int16), "float samples in [-1, 1], got int16 (16-bit PCM: divide by 32768)"),
    (np.array([0.1, np.nan, 0.2], dtype=np.float32), "non-finite sample (nan) at index 1"),
    (torch.tensor([0.0, float("inf")], dtype=torch.bfloat16), "non-finite sample (inf) at index 1"),
    (torch.zeros(400, dtype=torch.int16), "float samples in [-1, 1], got int16"),
])
def test_bad_input_is_refused_and_the_state_kept(bad, named):
    samples = waveform(0.05)
    fbank = StreamingFilterbank()
    fbank.accept_waveform(samples[:300])
    with pytest.raises(ValueError) as error:
        fbank.accept_waveform(bad)
    assert named in str(error.value)
    assert fbank.samples_accepted == 300  # the bad chunk left no trace
    np.testing.assert_allclose(fbank.accept_waveform(samples[300:]), log_mel_filterbank(samples, 16000),
                               rtol=0, atol=TOLERANCE)
