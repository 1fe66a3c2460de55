"""The three graphs a streaming transducer is exported as, each a module whose every input and output is a tensor.

* ``EncoderChunkStep``: one chunk of ``chunk_frames`` feature frames and every SSM state in -> the encoder frames
  of the chunk (and their joiner projection) and every SSM state out: the encoder's chunk form (``EncoderLayer.step``)
  laid out for the graph (``chunk_layers``: each SSM stage's chunk one matrix product), each state taken from an
  input and returned as an output instead of kept in a cache dict.
* ``PredictorStep``: one label per row and the LSTM state -> the joiner's projection of the predictor output and
  the new state (``asr.search.hypothesis.advance_predictor``).
* ``JoinerStep``: projected encoder and predictor rows -> logits (``Joiner.step``).

The chunk length is fixed (a multiple of the sub-sampling stride), so no frame ever waits in a sub-sampler between
chunks: the sub-samplers' buffers are always empty at a chunk boundary and need no input. The stream's last, partial
chunk is padded to ``chunk_frames`` and ``valid_frames`` says how many frames are real: before each time reduction
the frames past the valid ones are zeroed, as ``time_reduction`` zeroes an utterance's padding (and as
``time_reduction_step`` completes a stream's last group with zeros), so the valid output frames, ``encoder_frames``
of them, are those of ``SpeechEncoder.step(..., final=True)`` on the real frames alone (every layer is causal: a
padded frame reaches no earlier one). The states after a padded chunk are not the stream's: it must be the last.

The discrete SSM matrices are computed once here, from the trained parameters (MSSM's eigendecomposition included),
and enter the graphs as constants: a chunk is matrix products over fixed-size states.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..asr.encoder.speech_encoder import SpeechEncoder
from ..asr.encoder.subsampling import MultiScaleSubsampler, TimeReductionSubsampler, time_reduction
from ..asr.search.hypothesis import advance_predictor
from ..layers.encoder_layer import EncoderLayer
from ..ssm.recurrence import DIRECT_CHUNK
from .chunk_layers import ChunkEncoderLayer
from .errors import NotStreamableError


def _scaled_layers(encoder: SpeechEncoder) -> tuple[list[tuple[EncoderLayer, int]], int]:
    """Every encoder layer that keeps a state, in the order a chunk runs them, with the stride of the frame rate it
    runs at (the multi-scale sub-sampler's MSSM layers at 1 and 2, the encoder's at the sub-sampling stride)."""
    sub = encoder.subsampler
    layers = []
    if isinstance(sub, MultiScaleSubsampler):
        layers += [(layer, 2 ** i) for i, scale in enumerate(sub.scales) for layer in scale]
        stride = 2 ** len(sub.scales)
    elif isinstance(sub, TimeReductionSubsampler):
        stride = sub.stride
    else:
        raise NotStreamableError(f"{type(sub).__name__} has no chunk form: use the tr or ms sub-sampler")
    return layers + [(layer, stride) for layer in encoder.layers], stride


class EncoderChunkStep(nn.Module):
    """``features``: ``1 x chunk_frames x F`` (global-CMVN-normalised filterbanks), ``valid_frames``: ``1`` (int64,
    ``chunk_frames`` except in a stream's last chunk), then one ``1 x H x N`` state per SSM stage (``state_names``
    order) -> ``encoder_out`` ``1 x chunk_frames/stride x D``, ``encoder_proj`` ``1 x chunk_frames/stride x J`` (the
    joiner's projection), ``encoder_frames`` ``1`` (int64: how many output frames are valid) and the new states.

    Args:
        encoder: a streamable ``SpeechEncoder`` (``check_streamable``), in eval mode, without look-ahead.
        encoder_proj: the joiner's encoder projection (``Joiner.encoder_proj``).
        chunk_frames: feature frames per chunk, a positive multiple of the sub-sampling stride such that no SSM
            runs over more than ``DIRECT_CHUNK`` frames (the chunk's kernel is then a Toeplitz matrix: no FFT).
    """

    def __init__(self, encoder: SpeechEncoder, encoder_proj: nn.Linear, chunk_frames: int):
        super().__init__()
        try:
            encoder.check_streamable()
        except ValueError as error:
            raise NotStreamableError(str(error)) from error
        if getattr(encoder, "lookahead_frames", 0):
            raise NotStreamableError(f"an encoder with {encoder.lookahead_frames} frames of look-ahead: the chunk "
                                     "step exports encoders without look-ahead only")
        self.encoder, self.encoder_proj = encoder, encoder_proj
        scaled, self.stride = _scaled_layers(encoder)
        if chunk_frames < 1 or chunk_frames % self.stride:
            raise ValueError(f"chunk_frames must be a positive multiple of the sub-sampling stride ({self.stride}), "
                             f"got {chunk_frames}")
        longest = max([chunk_frames // stride for _, stride in scaled], default=0)
        if longest > DIRECT_CHUNK:
            raise ValueError(f"chunk_frames {chunk_frames} runs an SSM over {longest} frames; at most {DIRECT_CHUNK} "
                             f"per chunk (a longer one takes the FFT path, which is not exported): use a shorter chunk")
        self.chunk_frames = chunk_frames
        self.layers = nn.ModuleList(ChunkEncoderLayer(layer, self._layer_cache(layer, chunk_frames // stride),
                                                      chunk_frames // stride) for layer, stride in scaled)

    @staticmethod
    @torch.no_grad()
    def _layer_cache(layer: EncoderLayer, length: int) -> dict:
        """The step cache of ``layer`` after one chunk of ``length`` frames: each SSM block's recurrences (discrete
        matrices) and its states, whose shapes the graph's state inputs take."""
        width = layer.blocks[0].norm.normalized_shape[0]
        cache: dict = {}
        layer.step(torch.zeros(1, length, width), cache)
        return cache

    def state_shapes(self) -> list[tuple[int, ...]]:
        """The ``1 x H x N`` shape of every state input, in order."""
        return [shape for layer in self.layers for shape in layer.shapes]

    def state_names(self) -> list[str]:
        return [f"state_{i}" for i in range(len(self.state_shapes()))]

    def initial_states(self) -> list[Tensor]:
        return [torch.zeros(shape) for shape in self.state_shapes()]

    def _run_layers(self, layers, x: Tensor, states: list[Tensor], new_states: list[Tensor]) -> Tensor:
        """``1 x L x D`` frames through ``layers`` (``ChunkEncoderLayer``), each taking its states from the front of
        ``states`` and appending its next states to ``new_states``."""
        x = x[0]
        for layer in layers:
            count = len(layer.shapes)
            x, next_states = layer(x, states[:count])
            del states[:count]
            new_states += next_states
        return x.unsqueeze(0)

    def forward(self, features: Tensor, valid_frames: Tensor, *states: Tensor) -> tuple[Tensor, ...]:
        remaining, new_states = list(states), []
        sub = self.encoder.subsampler
        x, valid, index = sub.in_proj(features), valid_frames, 0
        if isinstance(sub, MultiScaleSubsampler):
            for scale in sub.scales:
                x = self._run_layers(self.layers[index:index + len(scale)], x, remaining, new_states)
                index += len(scale)
                x, valid = time_reduction(x, valid, 2)
        else:
            x, valid = time_reduction(x, valid, sub.stride)
        x = self._run_layers(self.layers[index:], x, remaining, new_states)
        encoder_out = self.encoder.final_norm(x)
        return (encoder_out, self.encoder_proj(encoder_out), valid, *new_states)


class PredictorStep(nn.Module):
    """``tokens``: ``N`` labels (int64), ``h``, ``c``: ``layers x N x hidden`` -> ``predictor_proj`` ``N x J`` (the
    joiner's projection of the predictor output after the labels) and the new ``h``, ``c``. Holds the model's
    ``predictor`` and ``joiner`` (not the fairseq model, whose ``train`` may refuse after ``make_generation_fast_``)."""

    def __init__(self, predictor: nn.Module, joiner: nn.Module):
        super().__init__()
        self.predictor, self.joiner = predictor, joiner

    def forward(self, tokens: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        state = [(h[i:i + 1], c[i:i + 1]) for i in range(h.shape[0])]
        proj, new_state = advance_predictor(self, tokens, state)
        return proj, torch.cat([s[0] for s in new_state]), torch.cat([s[1] for s in new_state])


class JoinerStep(nn.Module):
    """``encoder_proj``, ``predictor_proj``: ``N x J`` -> ``logits`` ``N x V`` (``Joiner.step``)."""

    def __init__(self, joiner):
        super().__init__()
        self.joiner = joiner

    def forward(self, encoder_proj: Tensor, predictor_proj: Tensor) -> Tensor:
        return self.joiner.step(encoder_proj, predictor_proj)
