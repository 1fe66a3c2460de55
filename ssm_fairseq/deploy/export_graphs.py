"""The three graphs a streaming transducer is exported as, each a module whose every input and output is a tensor.

* ``EncoderChunkStep``: one chunk of ``chunk_frames`` feature frames and every SSM state in -> the encoder frames
  of the chunk (and their joiner projection) and every SSM state out. It drives the encoder's own chunk form
  (``EncoderLayer.step``, whose causal MSSM blocks run ``Recurrence.chunk``) with each state taken from an input
  and returned as an output, instead of kept in a cache dict.
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
and enter the graphs as constants: a chunk is products and sums over fixed-size states.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..asr.encoder.speech_encoder import SpeechEncoder
from ..asr.encoder.subsampling import MultiScaleSubsampler, TimeReductionSubsampler, time_reduction
from ..asr.search.hypothesis import advance_predictor
from ..layers.encoder_layer import EncoderLayer
from ..ssm.fft_conv import check_input
from ..ssm.recurrence import DIRECT_CHUNK, DiagonalRecurrence
from ..ssm.structured_products import CHUNK_ELEMENTS
from .errors import NotStreamableError, UnsupportedModelError


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


class FixedChunkRecurrence(DiagonalRecurrence):
    """A ``DiagonalRecurrence`` for chunks of one piece (``chunk_frames`` checks it), traceable: its chunk matrices
    are looked up by a Python int (while the exporter traces, a tensor's length is itself a traced tensor, which
    would miss the matrices computed before and trace their computation, eigendecomposition included, into the
    graph instead of taking them as constants), and the one piece is not split (the exporter writes a split of one
    piece longer than the chunk as an invalid ``Split``). ``chunk`` is then ``DiagonalRecurrence.chunk``."""

    @classmethod
    @torch.no_grad()
    def of(cls, recurrence: DiagonalRecurrence, length: int) -> FixedChunkRecurrence:
        """``recurrence`` with its matrices for chunks of ``length`` computed (the graph's constants)."""
        fixed = cls(recurrence.dA, recurrence.dB, recurrence.dC, recurrence.D)
        fixed._piece_matrices(length)
        return fixed

    def _piece_matrices(self, L) -> tuple[Tensor, Tensor]:
        return super()._piece_matrices(int(L))

    def chunk(self, u: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        check_input(u, self.channels)
        return self._chunk_parallel(u.to(self.D.dtype), state)


class EncoderChunkStep(nn.Module):
    """``features``: ``1 x chunk_frames x F`` (global-CMVN-normalised filterbanks), ``valid_frames``: ``1`` (int64,
    ``chunk_frames`` except in a stream's last chunk), then one ``1 x H x N`` state per SSM stage (``state_names``
    order) -> ``encoder_out`` ``1 x chunk_frames/stride x D``, ``encoder_proj`` ``1 x chunk_frames/stride x J`` (the
    joiner's projection), ``encoder_frames`` ``1`` (int64: how many output frames are valid) and the new states.

    Args:
        encoder: a streamable ``SpeechEncoder`` (``check_streamable``), in eval mode.
        encoder_proj: the joiner's encoder projection (``Joiner.encoder_proj``).
        chunk_frames: feature frames per chunk, a positive multiple of the sub-sampling stride such that no SSM
            runs over more than ``DIRECT_CHUNK`` frames (a chunk is then one Toeplitz product: no FFT).
    """

    def __init__(self, encoder: SpeechEncoder, encoder_proj: nn.Linear, chunk_frames: int):
        super().__init__()
        try:
            encoder.check_streamable()
        except ValueError as error:
            raise NotStreamableError(str(error)) from error
        self.encoder, self.encoder_proj = encoder, encoder_proj
        self.layers, self.stride = _scaled_layers(encoder)
        if chunk_frames < 1 or chunk_frames % self.stride:
            raise ValueError(f"chunk_frames must be a positive multiple of the sub-sampling stride ({self.stride}), "
                             f"got {chunk_frames}")
        longest = max([chunk_frames // stride for _, stride in self.layers], default=0)
        if longest > DIRECT_CHUNK:
            raise ValueError(f"chunk_frames {chunk_frames} runs an SSM over {longest} frames; at most {DIRECT_CHUNK} "
                             f"per chunk (a longer one takes the FFT path, which is not exported): use a shorter chunk")
        self.chunk_frames = chunk_frames
        self.templates = [self._layer_cache(layer, stride) for layer, stride in self.layers]

    @torch.no_grad()
    def _layer_cache(self, layer: EncoderLayer, stride: int) -> dict:
        """The step cache of ``layer`` after one chunk: each SSM block's recurrences (discrete matrices, built once)
        and its states, whose shapes the graph's state inputs take."""
        width = layer.blocks[0].norm.normalized_shape[0]
        cache: dict = {}
        layer.step(torch.zeros(1, self.chunk_frames // stride, width), cache)
        for block in cache.values():
            block_recurrences = block.get("recurrences", [])
            if not all(type(r) is DiagonalRecurrence for r in block_recurrences):
                raise UnsupportedModelError(f"an SSM of recurrence {type(block_recurrences[0]).__name__}: the exporter "
                                            "handles diagonal (MSSM) recurrences")
            if any(r.dC.numel() * (self.chunk_frames // stride) > CHUNK_ELEMENTS for r in block_recurrences):
                raise ValueError(f"chunk_frames {self.chunk_frames} is more than one piece of Recurrence.chunk for this "
                                 "model's width: use a shorter chunk")
            block_recurrences[:] = [FixedChunkRecurrence.of(r, self.chunk_frames // stride) for r in block_recurrences]
            for state in block.get("states", []):
                if state.is_complex():
                    raise UnsupportedModelError("an SSM with a complex state: the exporter handles real-eigenvalue "
                                                "(MSSM) kernels, whose states are real")
        return cache

    def state_shapes(self) -> list[tuple[int, ...]]:
        """The ``1 x H x N`` shape of every state input, in order."""
        return [tuple(state.shape) for cache in self.templates for block in cache.values()
                for state in block.get("states", [])]

    def state_names(self) -> list[str]:
        return [f"state_{i}" for i in range(len(self.state_shapes()))]

    def initial_states(self) -> list[Tensor]:
        return [torch.zeros(shape) for shape in self.state_shapes()]

    def _run_layer(self, index: int, x: Tensor, states: list[Tensor], new_states: list[Tensor]) -> Tensor:
        """``layer.step`` on a cache holding the template's recurrences and the next of ``states``."""
        cache = {}
        for key, block in self.templates[index].items():
            if "states" in block:
                count = len(block["states"])
                cache[key] = {"recurrences": block["recurrences"], "states": states[:count]}
                del states[:count]
            else:
                cache[key] = {}
        x = self.layers[index][0].step(x, cache)
        for block in cache.values():
            new_states.extend(block.get("states", []))
        return x

    def forward(self, features: Tensor, valid_frames: Tensor, *states: Tensor) -> tuple[Tensor, ...]:
        remaining, new_states = list(states), []
        sub = self.encoder.subsampler
        x, valid, index = sub.in_proj(features), valid_frames, 0
        if isinstance(sub, MultiScaleSubsampler):
            for scale in sub.scales:
                for _ in scale:
                    x = self._run_layer(index, x, remaining, new_states)
                    index += 1
                x, valid = time_reduction(x, valid, 2)
        else:
            x, valid = time_reduction(x, valid, sub.stride)
        for _ in self.encoder.layers:
            x = self._run_layer(index, x, remaining, new_states)
            index += 1
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
