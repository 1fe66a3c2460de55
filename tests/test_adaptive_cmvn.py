"""Streaming-adaptive CMVN (``ssm_fairseq.asr.features.adaptive_cmvn``) and its decode-time wiring
(``features.transforms.decoding_transforms``, ``FeatureStream``, ``DecodingOptions.cmvn_*``, ``ssm-transcribe
--cmvn-*``): streamed = offline bit for bit at any chunking, the running statistics checked against a plain loop on
the raw filterbanks, an infinite prior is global CMVN, a stream unlike the prior converges to its own statistics,
and bad values are named errors."""
from __future__ import annotations

import math

import numpy as np
import pytest
from fairseq.data.audio.feature_transforms import CompositeAudioFeatureTransform
from fairseq.data.audio.feature_transforms.global_cmvn import GlobalCMVN
from fairseq.data.audio.feature_transforms.utterance_cmvn import UtteranceCMVN

from ssm_fairseq.asr.features.adaptive_cmvn import AdaptiveCMVN, RunningCMVN
from ssm_fairseq.asr.features.transforms import (FeatureStream, decoding_transforms, load_global_cmvn,
                                                 streaming_transform_problem, transformed)
from ssm_fairseq.asr.options import DecodingOptions
from ssm_fairseq.cli.transcribe import parse_args

BINS = 80


@pytest.fixture
def stats(tmp_path):
    """A gcmvn.npz of training statistics: mean and std per bin."""
    rng = np.random.default_rng(0)
    mean, std = rng.normal(10, 3, BINS).astype(np.float32), rng.uniform(1, 4, BINS).astype(np.float32)
    path = tmp_path / "gcmvn.npz"
    np.savez(path, mean=mean, std=std)
    return path, mean, std


def _speaker(frames: int, mean: np.ndarray, std: np.ndarray, seed: int = 1) -> np.ndarray:
    """``frames x 80`` float32 filterbanks of a 'speaker' whose bins have ``mean`` and ``std``."""
    return np.random.default_rng(seed).normal(mean, std, (frames, BINS)).astype(np.float32)


def _composite(stats_path, prior_frames: float) -> CompositeAudioFeatureTransform:
    return CompositeAudioFeatureTransform.from_config_dict({
        "feature_transforms": ["global_cmvn", "adaptive_cmvn"], "global_cmvn": {"stats_npz_path": str(stats_path)},
        "adaptive_cmvn": {"prior_frames": prior_frames}})


def _chunks(features: np.ndarray, sizes) -> list[np.ndarray]:
    bounds = np.cumsum([0] + list(sizes))
    assert bounds[-1] == len(features)
    return [features[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1000])
def test_streamed_is_offline_bit_for_bit_at_any_chunk_size(stats, chunk):
    path, mean, std = stats
    features = _speaker(517, mean + 2, std * 1.5)
    transforms = _composite(path, 300)
    offline = transformed(transforms, features)
    stream = FeatureStream(transforms)
    sizes = [chunk] * (len(features) // chunk) + ([len(features) % chunk] if len(features) % chunk else [])
    streamed = np.concatenate([transformed(stream, piece) for piece in _chunks(features, sizes)])
    assert streamed.dtype == offline.dtype == np.float32
    assert np.array_equal(streamed, offline)


def test_streamed_is_offline_with_uneven_and_empty_chunks(stats):
    path, mean, std = stats
    features = _speaker(400, mean - 1, std)
    offline = transformed(_composite(path, 50), features)
    running = FeatureStream(_composite(path, 50))
    sizes = [0, 5, 0, 1, 120, 13, 0, 261]
    streamed = np.concatenate([running(piece) for piece in _chunks(features, sizes)])
    assert np.array_equal(streamed, offline)


def test_running_statistics_are_those_of_a_plain_loop_on_the_raw_filterbanks(stats):
    """Independent truth: per frame, the mean and variance of the raw frames so far pooled with N frames of the
    training mean and variance, computed in a loop; after global CMVN the adaptive transform gives the same."""
    path, mean, std = stats
    features = _speaker(60, mean + 3, std * 0.5)
    prior = 25.0
    expected = np.empty((len(features), BINS))
    total, squares = prior * mean.astype(np.float64), prior * (std.astype(np.float64) ** 2 + mean.astype(np.float64) ** 2)
    for t, frame in enumerate(features.astype(np.float64)):
        total, squares = total + frame, squares + frame ** 2
        pooled_mean = total / (prior + t + 1)
        pooled_var = squares / (prior + t + 1) - pooled_mean ** 2
        expected[t] = (frame - pooled_mean) / np.sqrt(pooled_var)
    assert np.allclose(transformed(_composite(path, prior), features), expected, atol=2e-4)


def test_frame_t_depends_on_frames_up_to_t_only(stats):
    path, mean, std = stats
    features = _speaker(200, mean, std)
    changed = features.copy()
    changed[120:] += 7.0
    transforms = _composite(path, 30)
    assert np.array_equal(transformed(transforms, features)[:120], transformed(transforms, changed)[:120])
    assert not np.allclose(transformed(transforms, features)[120:], transformed(transforms, changed)[120:])


def test_an_infinite_prior_is_global_cmvn(stats):
    path, mean, std = stats
    features = _speaker(300, mean + 5, std * 2)
    global_only = transformed(GlobalCMVN(str(path)), features)
    assert np.array_equal(transformed(_composite(path, math.inf), features), global_only)
    assert np.allclose(transformed(_composite(path, 1e12), features), global_only, atol=1e-5)
    gaps = [np.abs(transformed(_composite(path, n), features) - global_only).max() for n in (10, 1e3, 1e5, 1e7)]
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] < 1e-2  # the larger the prior, the closer


def test_a_stream_unlike_the_prior_converges_to_its_own_statistics(stats):
    path, mean, std = stats
    speaker_mean, speaker_std = mean + 4 * std, std * 2.5  # 4 training stds off, 2.5 times as wide
    features = _speaker(20000, speaker_mean, speaker_std)
    out = transformed(_composite(path, 300), features)
    own = (features[-2000:] - speaker_mean) / speaker_std  # the speaker's true statistics
    # what is left of the prior (300 of 20,000 frames: about 1.5% of the 4-std shift) and of sampling
    assert np.abs(out[-2000:] - own).max() < 0.2 and np.abs(out[-2000:] - own).mean() < 0.05
    assert abs(out[-2000:].mean()) < 0.05 and abs(out[-2000:].std() - 1) < 0.05
    utterance = UtteranceCMVN()(features.astype(np.float64))  # the whole stream's own statistics, offline
    assert np.abs(out[-2000:] - utterance[-2000:]).max() < 0.2
    assert abs(transformed(GlobalCMVN(str(path)), features)[-2000:].mean()) > 3  # what global CMVN leaves
    running = RunningCMVN(300)  # the pooled statistics, in the globally normalised space
    running(GlobalCMVN(str(path))(features))
    assert np.allclose(running.mean, 4, atol=0.15) and np.allclose(running.variance, 2.5 ** 2, rtol=0.1)


def test_no_prior_is_causal_utterance_cmvn():
    features = np.random.default_rng(3).normal(2, 3, (50, 4)).astype(np.float32)
    out = AdaptiveCMVN(0)(features)
    assert np.array_equal(out[0], np.zeros(4, dtype=np.float32))
    assert np.allclose(out[-1], UtteranceCMVN()(features.astype(np.float64))[-1], atol=1e-5)


@pytest.mark.parametrize("bad", [-1, -0.5, math.nan, True, "300", None])
def test_bad_prior_weights_are_named_errors(bad):
    with pytest.raises(ValueError, match="prior_frames must be a number of frames >= 0"):
        AdaptiveCMVN(bad)
    with pytest.raises(ValueError, match="prior_frames must be a number of frames >= 0"):
        RunningCMVN(bad)


def test_config_without_prior_frames_and_bad_shapes_are_named_errors():
    with pytest.raises(ValueError, match="adaptive_cmvn section needs prior_frames"):
        CompositeAudioFeatureTransform.from_config_dict({"feature_transforms": ["adaptive_cmvn"]})
    running = RunningCMVN(10)
    with pytest.raises(ValueError, match=r"takes T x D frames, got shape \(5,\)"):
        running(np.zeros(5, dtype=np.float32))
    running(np.zeros((3, 4), dtype=np.float32))
    with pytest.raises(ValueError, match=r"takes T x 4 frames, as the stream's earlier frames, got shape \(2, 5\)"):
        running(np.zeros((2, 5), dtype=np.float32))
    assert running.frames == 3  # the refused chunk left the state as it was


def test_streaming_needs_a_state_per_stream_for_adaptive_cmvn(stats):
    path, _, _ = stats
    adaptive = _composite(path, 100)
    assert "keeps statistics per stream" in streaming_transform_problem(adaptive)
    assert streaming_transform_problem(adaptive, per_stream_state=True) is None
    utterance = CompositeAudioFeatureTransform([UtteranceCMVN()])
    assert "needs the whole utterance" in streaming_transform_problem(utterance, per_stream_state=True)
    with pytest.raises(ValueError, match="needs the whole utterance"):
        FeatureStream(utterance)


def test_decoding_transforms_replace_the_configs_cmvn(stats):
    path, mean, std = stats
    features = _speaker(250, mean + 1, std)
    global_config = CompositeAudioFeatureTransform([GlobalCMVN(str(path))])
    utterance_config = CompositeAudioFeatureTransform([UtteranceCMVN()])
    assert decoding_transforms(global_config) is global_config  # nothing asked, nothing replaced
    adapted = decoding_transforms(global_config, cmvn_adapt_frames=100)
    assert [type(t).__name__ for t in adapted.transforms] == ["GlobalCMVN", "AdaptiveCMVN"]
    assert np.array_equal(transformed(adapted, features), transformed(_composite(path, 100), features))
    from_utterance = decoding_transforms(utterance_config, cmvn_stats=path, cmvn_adapt_frames=100)
    assert np.array_equal(transformed(from_utterance, features), transformed(adapted, features))
    assert np.array_equal(transformed(decoding_transforms(utterance_config, cmvn_stats=path), features),
                          transformed(global_config, features))
    # an infinite prior and a config's adaptive CMVN replaced by global statistics: global CMVN alone
    for replaced in (decoding_transforms(global_config, cmvn_adapt_frames=math.inf),
                     decoding_transforms(_composite(path, 100), cmvn_stats=path)):
        assert [type(t).__name__ for t in replaced.transforms] == ["GlobalCMVN"]
    assert decoding_transforms(_composite(path, 100), cmvn_adapt_frames=7).transforms[1].prior_frames == 7


def test_decoding_transforms_name_what_is_missing(stats, tmp_path):
    path, _, _ = stats
    with pytest.raises(ValueError, match="applies UtteranceCMVN without them: give them"):
        decoding_transforms(CompositeAudioFeatureTransform([UtteranceCMVN()]), cmvn_adapt_frames=100)
    with pytest.raises(ValueError, match="needs one CMVN transform"):
        decoding_transforms(CompositeAudioFeatureTransform([]), cmvn_adapt_frames=100)
    with pytest.raises(ValueError, match="prior_frames must be a number of frames >= 0"):
        decoding_transforms(CompositeAudioFeatureTransform([GlobalCMVN(str(path))]), cmvn_adapt_frames=-2)
    with pytest.raises(FileNotFoundError, match="missing.npz: CMVN statistics not found"):
        load_global_cmvn(tmp_path / "missing.npz")
    np.savez(tmp_path / "short.npz", mean=np.zeros(40), std=np.ones(40))
    with pytest.raises(ValueError, match=r"short.npz: mean must be 80 finite numbers, got shape \(40,\)"):
        load_global_cmvn(tmp_path / "short.npz")
    np.savez(tmp_path / "zero.npz", mean=np.zeros(80), std=np.zeros(80))
    with pytest.raises(ValueError, match="zero.npz: std must be above 0"):
        load_global_cmvn(tmp_path / "zero.npz")
    (tmp_path / "text.npz").write_text("not numpy")
    with pytest.raises(ValueError, match="text.npz: not CMVN statistics"):
        load_global_cmvn(tmp_path / "text.npz")


@pytest.mark.parametrize("bad", [-1, math.nan, True, "300"])
def test_decoding_options_refuse_bad_prior_weights(bad):
    with pytest.raises(ValueError, match="cmvn_adapt_frames must be a number of frames >= 0"):
        DecodingOptions(cmvn_adapt_frames=bad)


def test_command_line_options(capsys):
    args = parse_args(["--checkpoint", "c.pt", "a.wav", "--cmvn-adapt", "300", "--cmvn-stats", "g.npz"])
    assert (args.cmvn_adapt_frames, args.cmvn_stats) == (300.0, "g.npz")
    assert math.isinf(parse_args(["--checkpoint", "c.pt", "a.wav", "--cmvn-adapt", "inf"]).cmvn_adapt_frames)
    for argv, message in ((["--checkpoint", "c.pt", "a.wav", "--cmvn-adapt", "-5"], "--cmvn-adapt: cmvn_adapt_frames"),
                          (["--onnx", "d", "a.wav", "--cmvn-adapt", "5"], "an --onnx directory applies the CMVN")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err
