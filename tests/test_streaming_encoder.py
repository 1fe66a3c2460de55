"""The causal encoder and streaming search: chunk by chunk equals the full forward pass and the offline search."""
from __future__ import annotations

import pytest
import torch

from ssm_fairseq.asr.search.beam_search import BeamSearch, beam_search
from ssm_fairseq.asr.search.greedy_search import GreedySearch, greedy_search
from ssm_fairseq.asr.search.hypothesis import SearchSettings
from ssm_fairseq.layers.encoder_layer import EncoderLayer, LayerConfig
from ssm_fairseq.asr.encoder.speech_encoder import SpeechEncoder
from transducer_cases import SMALL, build

torch.set_num_threads(2)

CAUSAL = LayerConfig(dim=32, ffn_dim=64, attention_heads=4, ssm_heads=4, ssm_state_size=4, dropout=0.0, causal=True)
FEATURES = 10


def _encoder(subsampler: str, seed: int = 0) -> SpeechEncoder:
    torch.manual_seed(seed)
    return SpeechEncoder("mssm", 2, CAUSAL, input_dim=FEATURES, subsampler=subsampler, tr_stride=4).double().eval()


def _stream(encoder: SpeechEncoder, features: torch.Tensor, chunk: int) -> torch.Tensor:
    """``1 x T x F`` features fed ``chunk`` frames at a time -> the ``1 x T' x D`` encoder frames of the stream."""
    cache, outputs, T = {}, [], features.shape[1]
    for start in range(0, T, chunk):
        outputs.append(encoder.step(features[:, start:start + chunk], cache, final=start + chunk >= T))
    return torch.cat(outputs, dim=1)


@pytest.mark.parametrize("subsampler", ["tr", "ms"])
@pytest.mark.parametrize("chunk", [1, 7, 32])  # 10 ms, 70 ms and 320 ms of filterbank frames
def test_chunk_by_chunk_equals_the_full_causal_forward_pass(subsampler, chunk):
    encoder = _encoder(subsampler)
    features = torch.randn(1, 61, FEATURES, dtype=torch.float64)  # 61: the last sub-sampling group is partial
    with torch.no_grad():
        full = encoder(features, torch.tensor([61]))["encoder_out"]
        streamed = _stream(encoder, features, chunk)
    assert streamed.shape == full.shape == (1, 16, 32)
    assert torch.allclose(streamed, full, atol=1e-8, rtol=0)


@pytest.mark.parametrize("subsampler", ["tr", "ms"])
def test_each_stream_equals_its_row_of_a_padded_batch(subsampler):
    encoder = _encoder(subsampler, seed=1)
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


def _causal_model():
    torch.manual_seed(3)
    model = build("mssm_transducer_streaming", *SMALL, "--subsampler", "tr", vocab_size=11)[0]
    return model.double().eval()


def _streamed_search(model, features, chunk, search):
    """Encoder steps and search advances chunk by chunk, as a streaming recogniser runs them."""
    cache, T = {}, features.shape[1]
    for start in range(0, T, chunk):
        encoded = model.encoder.step(features[:, start:start + chunk], cache, final=start + chunk >= T)
        search.advance(encoded)
    return search


@pytest.mark.parametrize("chunk", [1, 13])
def test_streaming_greedy_and_beam_search_return_the_offline_hypotheses(chunk):
    model = _causal_model()
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
