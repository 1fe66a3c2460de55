"""The whole-utterance (offline) encoder graph: a bidirectional MSSM encoder exported without an FFT.

``SpeechEncoder.forward`` convolves each SSM stage with its kernel by FFT, the kernel generated for the utterance's
length. Neither exports: torch's TorchScript exporter has no symbolic for ``aten::fft_rfft`` ("Exporting the operator
'aten::fft_rfft' to ONNX opset version 17 is not supported"), and the ``torch.export`` exporter that lowers it to
ONNX ``DFT`` needs ``onnxscript`` and a kernel of every length traced as a function of it. MSSM's real eigenvalues
give the same convolution in a chunked form instead (``ssm.chunked_conv``'s arithmetic, laid out for the graph):

* the sequence, padded to whole pieces of ``P`` frames, is ``nc`` pieces; within a piece each channel is the chunk
  step's matrix product (``chunk_layers.chunk_matrix``): the outputs from the piece's inputs and its start state,
  and the state the piece's inputs leave at its end;
* the start state of piece ``k`` is ``sum_{m<k} dA^(P (k-1-m)) s_m``: one batched product with an ``nc x nc``
  matrix of powers built in the graph from the length, so no loop runs over the pieces;
* the anti-causal direction is the causal algorithm on the time-reversed frames (``Rev(SSM(Rev(x)))``, as
  ``MultiHeadSSM(reverse=True)`` computes it); each direction pads its own sequence at its end, so the padding only
  reaches padded frames.

Cost per stage: ``O(L (P + N) C)`` for the pieces and ``O(N nc^2)`` per channel for the start states. One utterance
(no batch axis inside): ``features`` ``1 x T x F`` -> ``encoder_out`` ``1 x T' x D``, ``encoder_proj`` ``1 x T' x J``.
Supported: layers of type ``mssm`` (bidirectional, or causal) on the ``tr`` or ``conv`` sub-sampler, without
sinusoidal positions or look-ahead.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..asr.encoder.speech_encoder import SpeechEncoder
from ..asr.encoder.subsampling import ConvSubsampler, TimeReductionSubsampler
from ..layers.feed_forward import FeedForward
from ..layers.state_space.bidirectional_ssm import BidirectionalSSM
from ..layers.state_space.multihead_ssm import GATINGS, MultiHeadSSM
from .chunk_layers import activated, chunk_matrix, diagonal_recurrences
from .errors import UnsupportedModelError

DEFAULT_PIECE_FRAMES = 16  # encoder frames per piece (0.64 s at stride 4)


class WholeSequenceSSM(nn.Module):
    """One direction of a ``MultiHeadSSM`` over a whole sequence, causally: ``L x D -> L x D`` (its last Linear
    included where it has one), in pieces of ``piece`` frames."""

    def __init__(self, ssm: MultiHeadSSM, piece: int):
        super().__init__()
        self.ssm, self.piece, self.outputs = ssm, piece, GATINGS[ssm.gating]
        recurrences = diagonal_recurrences(ssm)
        self.stages = len(recurrences)
        for i, recurrence in enumerate(recurrences):
            matrix = chunk_matrix(recurrence, piece)  # D x (P + N) x (C P + N); the graph keeps the parts it uses:
            CP = piece * self.outputs
            self.register_buffer(f"outputs_{i}", matrix[:, :, :CP].clone())  # D x (P + N) x C P: y from u, x
            self.register_buffer(f"end_state_{i}", matrix[:, :piece, CP:].clone())  # D x P x N: x' from u
            self.register_buffer(f"decay_{i}", recurrence.dA ** piece)  # D x N: a piece's decay of the state

    def _stage(self, u: Tensor, i: int) -> Tensor:
        """``L' x D`` inputs (``L'`` a multiple of the piece) -> ``L' C x D`` outputs (step-major, then output)."""
        P = self.piece
        decay = getattr(self, f"decay_{i}")
        D, N = decay.shape
        pieces = u.t().reshape(D, -1, P)  # D x nc x P
        ends = torch.matmul(pieces, getattr(self, f"end_state_{i}"))  # D x nc x N: the pieces' own end states
        index = torch.arange(pieces.shape[1], dtype=u.dtype)
        lag = index.unsqueeze(0) - index.unsqueeze(1) - 1  # [m, k]: k - 1 - m
        powers = torch.where(lag >= 0, decay[..., None, None] ** lag.clamp(min=0), torch.zeros((), dtype=u.dtype))
        starts = torch.matmul(ends.transpose(1, 2).unsqueeze(2), powers).squeeze(2)  # D x N x nc
        y = torch.matmul(torch.cat([pieces, starts.transpose(1, 2)], -1), getattr(self, f"outputs_{i}"))  # D nc CP
        return y.reshape(D, -1).t()

    def forward(self, x: Tensor) -> Tensor:
        L = x.shape[0]
        x = F.pad(x, (0, 0, 0, (-L) % self.piece))
        ssm = self.ssm
        x = x if ssm.in_proj is None else ssm.in_proj(x)
        for i in range(self.stages):
            x = activated(ssm.gating, self._stage(x, i), x.shape[0])
            if i < len(ssm.linears):
                x = ssm.linears[i](x)
        return x[:L]


class WholeSequenceBidirectionalSSM(nn.Module):
    """``BidirectionalSSM`` over a whole sequence: ``L x D -> L x D``."""

    def __init__(self, block: BidirectionalSSM, piece: int):
        super().__init__()
        self.forward_ssm = WholeSequenceSSM(block.forward_ssm, piece)
        self.backward_ssm = WholeSequenceSSM(block.backward_ssm, piece)
        self.out_proj = block.out_proj

    def forward(self, x: Tensor) -> Tensor:
        backward = self.backward_ssm(x.flip(0)).flip(0)
        return self.out_proj(torch.cat([self.forward_ssm(x), backward], -1))


def _whole_sequence_block(block: nn.Module, piece: int) -> nn.Module:
    if isinstance(block, BidirectionalSSM):
        return WholeSequenceBidirectionalSSM(block, piece)
    if isinstance(block, MultiHeadSSM) and not block.reverse:
        return WholeSequenceSSM(block, piece)
    if isinstance(block, FeedForward):
        return block
    raise UnsupportedModelError(f"a {type(block).__name__} block: the offline export handles MSSM layers (SSM blocks "
                                "and feed-forward) only")


class OfflineEncoder(nn.Module):
    """``features`` ``1 x T x F`` (normalised filterbanks) -> ``encoder_out`` ``1 x T' x D`` and ``encoder_proj``
    ``1 x T' x J``: ``SpeechEncoder.forward`` on one utterance, with each SSM block in its whole-sequence chunked form.

    Args:
        encoder: a ``SpeechEncoder`` of ``mssm`` layers on the ``tr`` or ``conv`` sub-sampler, in eval mode.
        encoder_proj: the joiner's encoder projection.
        piece: encoder frames per piece of the chunked convolution.
    """

    def __init__(self, encoder: SpeechEncoder, encoder_proj: nn.Linear, piece: int = DEFAULT_PIECE_FRAMES):
        super().__init__()
        if not isinstance(encoder.subsampler, (TimeReductionSubsampler, ConvSubsampler)):
            raise UnsupportedModelError(f"the {type(encoder.subsampler).__name__}: the offline export handles the tr "
                                        "and conv sub-samplers (the ms sub-sampler's SSM layers are not exported)")
        if encoder.positions or getattr(encoder, "lookahead_frames", 0):
            raise UnsupportedModelError("an encoder with sinusoidal positions or look-ahead: not exported")
        if piece < 1:
            raise ValueError(f"piece must be a positive number of frames, got {piece}")
        self.encoder, self.encoder_proj = encoder, encoder_proj
        self.blocks = nn.ModuleList(nn.ModuleList(_whole_sequence_block(residual.block, piece)
                                                  for residual in layer.blocks) for layer in encoder.layers)

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor]:
        lengths = torch.full((1,), features.shape[1], dtype=torch.long)
        x, _, _ = self.encoder.subsampler(features, lengths)
        x = x[0]
        for layer, blocks in zip(self.encoder.layers, self.blocks):
            for residual, block in zip(layer.blocks, blocks):
                x = x + block(residual.norm(x))
            x = layer.final_norm(x)
        encoder_out = self.encoder.final_norm(x).unsqueeze(0)
        return encoder_out, self.encoder_proj(encoder_out)
