"""The causal encoder and streaming search: chunk by chunk equals the full forward pass and the offline search."""
from __future__ import annotations

import pytest
import torch

from ssm_fairseq.asr.search.beam_search import BeamSearch, beam_search
from ssm_fairseq.asr.search.greedy_search import GreedySearch, greedy_search
from ssm_fairseq.asr.search.hypothesis import SearchSettings
from ssm_fairseq.layers.encoder_layer import EncoderLayer, LayerConfig
from ssm_fairseq.asr.encoder.speech_encoder import SpeechEncoder
from transducer_cases import SMALL, build, random_sample

CAUSAL = LayerConfig(dim=32, ffn_dim=64, attention_heads=4, ssm_heads=4, ssm_state_size=4, dropout=0.0, causal=True)
FEATURES = 10


def _encoder(subsampler: str, seed: int = 0, lookahead: int = 0, layers: int = 2,
             mixing: str = "channel") -> SpeechEncoder:
    """A random causal encoder in float64; with ``lookahead`` frames, random look-ahead taps and projection (their
    identity initialisation would give no frame any weight from the future)."""
    torch.manual_seed(seed)
    encoder = SpeechEncoder("mssm", layers, CAUSAL, input_dim=FEATURES, subsampler=subsampler, tr_stride=4,
                            lookahead_frames=lookahead, lookahead_mixing=mixing).double().eval()
    if lookahead:
        _randomise(encoder.lookahead)
    return encoder


def _randomise(lookahead) -> None:
    """Random look-ahead taps (N(0, 1)) and, with full mixing, projection (0.3 x N(0, 1))."""
    with torch.no_grad():
        lookahead.weight.normal_()
        if lookahead.future is not None:
            lookahead.future.weight.normal_(std=0.3)


def _stream(encoder: SpeechEncoder, features: torch.Tensor, chunk: int) -> torch.Tensor:
    """``1 x T x F`` features fed ``chunk`` frames at a time -> the ``1 x T' x D`` encoder frames of the stream."""
    cache, outputs, T = {}, [], features.shape[1]
    for start in range(0, T, chunk):
        outputs.append(encoder.step(features[:, start:start + chunk], cache, final=start + chunk >= T))
    return torch.cat(outputs, dim=1)


def _steps(encoder: SpeechEncoder, features: torch.Tensor, chunk: int) -> list[int]:
    """How many encoder frames each step of ``_stream`` returns (the last one: ``final``)."""
    cache, T = {}, features.shape[1]
    return [encoder.step(features[:, start:start + chunk], cache, final=start + chunk >= T).shape[1]
            for start in range(0, T, chunk)]


@pytest.mark.parametrize("subsampler, lookahead, layers, mixing", [
    ("tr", 0, 2, "channel"), ("ms", 0, 2, "channel"), ("tr", 2, 2, "channel"), ("ms", 1, 3, "channel"),
    ("ms", 2, 3, "channel"), ("ms", 4, 3, "channel"), ("tr", 2, 2, "full"), ("ms", 4, 3, "full")])
@pytest.mark.parametrize("chunk", [1, 7, 32])  # 10 ms, 70 ms and 320 ms of filterbank frames
def test_chunk_by_chunk_equals_the_full_causal_forward_pass(subsampler, lookahead, layers, mixing, chunk):
    encoder = _encoder(subsampler, lookahead=lookahead, layers=layers, mixing=mixing)
    features = torch.randn(1, 61, FEATURES, dtype=torch.float64)  # 61: the last sub-sampling group is partial
    with torch.no_grad():
        full = encoder(features, torch.tensor([61]))["encoder_out"]
        streamed = _stream(encoder, features, chunk)
        steps = _steps(encoder, features, chunk)
    assert streamed.shape == full.shape == (1, 16, 32)
    assert torch.allclose(streamed, full, atol=1e-8, rtol=0)
    # every step gives the frames whose look-ahead is complete: frame t once the input reaches frame t + K
    given = 0
    for n, frames in enumerate(steps[:-1], start=1):
        given += frames
        assert given == max(0, min(n * chunk, 61) // 4 - lookahead)
    assert given + steps[-1] == 16  # the end of the stream gives the frames held


@pytest.mark.parametrize("subsampler, lookahead", [("tr", 0), ("ms", 0), ("ms", 2), ("tr", 4)])
def test_each_stream_equals_its_row_of_a_padded_batch(subsampler, lookahead):
    encoder = _encoder(subsampler, seed=1, lookahead=lookahead)
    lengths = [45, 29, 8]
    features = torch.zeros(3, 45, FEATURES, dtype=torch.float64)
    for b, T in enumerate(lengths):
        features[b, :T] = torch.randn(T, FEATURES, dtype=torch.float64)
    features[1, 29:] = 1e3  # garbage past a length must not matter either
    with torch.no_grad():
        batch = encoder(features, torch.tensor(lengths))
        for b, T in enumerate(lengths):
            streamed = _stream(encoder, features[b:b + 1, :T], 7)
            valid = int(batch["encoder_lengths"][b])
            assert streamed.shape[1] == valid
            assert torch.allclose(streamed[0], batch["encoder_out"][b, :valid], atol=1e-8, rtol=0)


@pytest.mark.parametrize("subsampler", ["tr", "ms"])
@pytest.mark.parametrize("lookahead, mixing", [(0, "channel"), (1, "channel"), (2, "channel"), (4, "channel"),
                                               (2, "full")])
def test_an_encoder_frame_sees_its_lookahead_and_no_further(subsampler, lookahead, mixing):
    """Encoder frame ``t`` changes with the features of sub-sampled frame ``t + K`` (filterbank frames ``4(t + K)
    .. 4(t + K) + 3``) and with none after them."""
    encoder = _encoder(subsampler, seed=4, lookahead=lookahead, layers=3, mixing=mixing)
    features = torch.randn(1, 64, FEATURES, dtype=torch.float64)
    t = 6
    last_seen = 4 * (t + lookahead) + 3  # the last filterbank frame encoder frame t depends on
    after, at = features.clone(), features.clone()
    after[:, last_seen + 1:] = torch.randn(1, 64 - last_seen - 1, FEATURES, dtype=torch.float64)
    at[:, last_seen] += 1.0
    with torch.no_grad():
        out, out_after, out_at = (encoder(x, torch.tensor([64]))["encoder_out"] for x in (features, after, at))
    assert torch.allclose(out[:, :t + 1], out_after[:, :t + 1], atol=1e-12, rtol=0)  # (FFT rounding: 1e-15)
    assert torch.allclose(out[:, :t], out_at[:, :t], atol=1e-12, rtol=0)
    assert not torch.allclose(out[:, t], out_at[:, t], atol=1e-6)


def test_lookahead_is_the_identity_at_initialisation_and_refuses_no_future_frame():
    from ssm_fairseq.asr.encoder.lookahead import LookAhead
    layer = LookAhead(8, 3)
    x = torch.randn(2, 5, 8)
    assert torch.equal(layer(x), x) and layer.weight.shape == (8, 4)
    for frames in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="at least 1 future frame"):
            LookAhead(8, frames)
    assert not any("lookahead" in name for name in _encoder("ms").state_dict())  # K = 0: no parameters
    full = LookAhead(8, 3, "full")
    assert torch.equal(full(x), x) and full.future.weight.shape == (8, 24)
    with pytest.raises(ValueError, match="look-ahead mixing must be one of channel, full, got 'dense'"):
        LookAhead(8, 3, "dense")


@pytest.mark.parametrize("mixing", ["channel", "full"])
def test_training_reaches_the_future_taps_from_their_identity_initialisation(mixing):
    """``--lookahead-frames 2``: the transducer loss's gradient reaches every tap of the look-ahead layer (and
    every weight of the full mixing's projection), the future ones too while they are still 0 (the layer starts as
    the identity)."""
    model, criterion, _, task = build("mssm_transducer_streaming", *SMALL, "--lookahead-frames", "2",
                                      "--lookahead-mixing", mixing)
    weight = model.encoder.lookahead.weight
    assert weight.shape == (32, 3) and torch.equal(weight[:, 1:], torch.zeros(32, 2))
    future = model.encoder.lookahead.future
    assert (future is None) == (mixing == "channel")
    model.train()
    loss, _, _ = criterion(model, random_sample(task, [37, 50], [4, 6]))
    loss.backward()
    assert (weight.grad[:, 1:].abs() > 0).float().mean() > 0.9
    if future is not None:
        assert torch.equal(future.weight, torch.zeros(32, 64)) and (future.weight.grad.abs() > 0).float().mean() > 0.9


@pytest.mark.parametrize("layer_type", ["mssm", "stateformer", "transformer"])
def test_a_causal_layer_never_looks_ahead(layer_type):
    torch.manual_seed(2)
    layer = EncoderLayer(layer_type, CAUSAL).double().eval()
    x = torch.randn(2, 20, 32, dtype=torch.float64)
    changed = x.clone()
    changed[:, 12:] = torch.randn(2, 8, 32, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(layer(x)[:, :12], layer(changed)[:, :12], atol=1e-12)
        assert not torch.allclose(layer(x)[:, 12:], layer(changed)[:, 12:])


def test_encoders_that_need_the_whole_utterance_say_why():
    bidirectional = SpeechEncoder("mssm", 1, LayerConfig(dim=32, ffn_dim=64, ssm_heads=4), input_dim=FEATURES,
                                  subsampler="tr")
    with pytest.raises(ValueError, match="BidirectionalSSM needs the whole utterance"):
        bidirectional.step(torch.randn(1, 8, FEATURES), {})
    with pytest.raises(ValueError, match="ConvSubsampler cannot run chunk by chunk"):
        SpeechEncoder("mssm", 1, CAUSAL, input_dim=FEATURES, subsampler="conv").check_streamable()
    with pytest.raises(ValueError, match="SelfAttention needs the whole utterance"):  # causal, but no state
        SpeechEncoder("transformer", 1, CAUSAL, input_dim=FEATURES, subsampler="tr").check_streamable()
    with pytest.raises(ValueError, match="a causal encoder needs layers of type"):
        EncoderLayer("conformer", CAUSAL)
    with pytest.raises(ValueError, match="--causal-encoder needs --subsampler tr or ms"):
        build("mssm_transducer_streaming", *SMALL, "--subsampler", "conv")
    with pytest.raises(ValueError, match="--lookahead-frames 2 needs --causal-encoder"):
        build("mssm_transducer", *SMALL, "--lookahead-frames", "2")
    with pytest.raises(ValueError, match="--lookahead-frames must be 0 or more, got -1"):
        build("mssm_transducer_streaming", *SMALL, "--lookahead-frames", "-1")


def _causal_model(subsampler: str = "tr", layers: int = 2, lookahead: int = 0, mixing: str = "channel"):
    """A random ``mssm_transducer_streaming`` in float64 (with ``lookahead``: random look-ahead taps)."""
    torch.manual_seed(3)
    model = build("mssm_transducer_streaming", *SMALL, "--subsampler", subsampler, "--encoder-layers", str(layers),
                  "--lookahead-frames", str(lookahead), "--lookahead-mixing", mixing,
                  vocab_size=11)[0].double().eval()
    if lookahead:
        _randomise(model.encoder.lookahead)
    return model


def _streamed_search(model, features, chunk, search):
    """Encoder steps and search advances chunk by chunk, as a streaming recogniser runs them."""
    cache, T = {}, features.shape[1]
    for start in range(0, T, chunk):
        encoded = model.encoder.step(features[:, start:start + chunk], cache, final=start + chunk >= T)
        search.advance(encoded)
    return search


@pytest.mark.parametrize("subsampler, layers, lookahead, mixing", [
    ("tr", 2, 0, "channel"), ("ms", 3, 1, "channel"), ("ms", 3, 2, "channel"), ("ms", 3, 4, "channel"),
    ("ms", 3, 2, "full")])
@pytest.mark.parametrize("chunk", [1, 13])
def test_streaming_greedy_and_beam_search_return_the_offline_hypotheses(chunk, subsampler, layers, lookahead, mixing):
    """No blank penalty: the random model emits labels at most frames and blanks at others (greedy), and the beam
    merges and prunes hypotheses of several lengths; the same with look-ahead, against offline with the same K."""
    model = _causal_model(subsampler, layers, lookahead, mixing)
    suppress = (1, 2, 3)  # <pad>, </s>, <unk>
    for T in (37, 50):
        features = torch.randn(1, T, 80, dtype=torch.float64)
        with torch.no_grad():
            encoder = model.encoder(features, torch.tensor([T]))
        offline_greedy = greedy_search(model, encoder["encoder_out"], encoder["encoder_lengths"], 3, suppress)[0]
        settings = SearchSettings(3, suppress)
        streamed = _streamed_search(model, features, chunk, GreedySearch(model, 1, features.device, settings))
        (greedy,), = streamed.finish()
        assert greedy.tokens == offline_greedy.tokens and greedy.frames == offline_greedy.frames
        assert greedy.score == pytest.approx(offline_greedy.score, abs=1e-6)

        offline_beam = beam_search(model, encoder["encoder_out"], encoder["encoder_lengths"], 3, 3, nbest=3,
                                   suppress=suppress)[0]
        streamed = _streamed_search(model, features, chunk, BeamSearch(model, 1, features.device, 3, settings))
        partial = streamed.partial()[0]
        beams = streamed.finish(nbest=3)[0]
        assert [h.tokens for h in beams] == [h.tokens for h in offline_beam]
        assert [h.frames for h in beams] == [h.frames for h in offline_beam]
        assert [h.score for h in beams] == pytest.approx([h.score for h in offline_beam], abs=1e-6)
        assert partial.score == max(h.score for h in beams)
        assert greedy.tokens and any(h.tokens for h in beams)  # labels were emitted, not only blanks


def test_searches_number_each_utterances_frames_and_finish_once():
    """A batch of streams of different lengths: each utterance's frames are numbered by its own frames, and a
    finished search takes no more frames."""
    model = _causal_model()
    encoder_out = torch.randn(2, 9, 32, dtype=torch.float64)
    for search in (GreedySearch(model, 2, encoder_out.device, SearchSettings(3, (1, 2, 3), 20.0)),
                   BeamSearch(model, 2, encoder_out.device, 2, SearchSettings(3, (1, 2, 3), 20.0))):
        search.advance(encoder_out[:, :4], torch.tensor([4, 2]))  # utterance 1 gets two frames, then the rest
        search.advance(encoder_out[:, 4:], torch.tensor([5, 5]))
        frames = [h.frames for h in search.partial()]
        assert max(frames[1]) == 6 and all(f < 7 for f in frames[1]) and max(frames[0]) == 8
        search.finish()
        with pytest.raises(ValueError, match="the search has finished"):
            search.advance(encoder_out)
