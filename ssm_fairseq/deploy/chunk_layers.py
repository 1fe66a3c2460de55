"""The encoder layers of the exported chunk step, for one stream, in the form that ONNX Runtime runs fastest: few and
large nodes.

``EncoderLayer.step`` (the PyTorch stream) keeps ``B x L x D`` frames and runs each SSM stage as three ``einsum``
contractions over ``B x C x D x L`` tensors with transposes between stages; traced as it is, a 32-frame chunk of the
mini streaming model was 790 ONNX nodes, 70% of whose time went to ``Einsum`` (ONNX Runtime's is a generic, slow
kernel). Here the same arithmetic is laid out for the graph:

* a stage's chunk is one batched ``MatMul``: for channel ``h`` the chunk is linear in ``[u_h (L), x_h (N)]`` (the
  chunk's inputs and the state), so ``chunk_matrix`` folds the Toeplitz product with the kernel, the skip term
  ``D u``, the state's decaying response and the next state into one ``(L + N) x (C L + N)`` matrix per channel,
  computed at export from the discretised system (a constant of the graph), all ``D`` channels in one product;
* the frames are time-major (``L x D``) between the stages, so that each Linear is a ``Gemm`` of the frames by the
  weight (``x W^T + b``), the form whose weights ``quantize_dynamic`` quantizes, and channels first (``D x L``) in
  the product, one small ``Transpose`` each way;
* the product's columns are step-major (``L x C`` outputs per channel), so that once transposed the gating's halves
  and pairs are column blocks and its output is already in ``MultiHeadSSM.activate``'s channel order.

The layers' other blocks (position-wise feed-forward, layer norms) run their own ``step`` on ``L x D`` frames. One
stream (no batch axis): the states are ``1 x D x N``, as ``EncoderLayer.step``'s for one stream.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers.encoder_layer import EncoderLayer
from ..layers.state_space.multihead_ssm import GATINGS, MultiHeadSSM
from ..ssm.recurrence import DiagonalRecurrence
from .errors import UnsupportedModelError


@torch.no_grad()
def chunk_matrix(recurrence: DiagonalRecurrence, L: int) -> Tensor:
    """The chunk of ``L`` steps of a real diagonal recurrence (``DiagonalRecurrence._chunk_parallel``) as one matrix
    per channel: ``H x (L + N) x (C L + N)``, rows the inputs ``u_0..u_{L-1}`` then the state ``x_0..x_{N-1}``,
    columns the outputs ``y_{k,c}`` (step-major, ``C`` outputs each) then the next state, so that
    ``[u_h, x_h] @ M_h`` is ``[y_h, x'_h]``."""
    if recurrence.dA.is_complex():
        raise UnsupportedModelError("an SSM with a complex state: the exporter handles real-eigenvalue (MSSM) kernels, "
                                    "whose states are real")
    dA, dB, dC, D = recurrence.dA, recurrence.dB, recurrence.dC, recurrence.D
    C, H, N = dC.shape
    K, powers = recurrence._piece_matrices(L)  # kernel, C x H x L (k) x L (j) Toeplitz up to DIRECT_CHUNK; H x N x L
    if K.dim() != 4:
        raise ValueError(f"a chunk of {L} steps is longer than the recurrence's direct (Toeplitz) pieces")
    from_inputs = K + D[..., None, None] * torch.eye(L, dtype=K.dtype)  # C x H x k x j: y_{c,k} from u_j
    from_state = dC.unsqueeze(2) * (dA.unsqueeze(-1) * powers).transpose(1, 2)  # C x H x k x n: y_{c,k} from x_n
    state_from_inputs = (powers.flip(-1) * dB.unsqueeze(-1)).transpose(1, 2)  # H x j x n: x'_n from u_j
    matrix = dA.new_zeros(H, L + N, C * L + N)
    matrix[:, :L, :C * L] = from_inputs.permute(1, 3, 2, 0).reshape(H, L, L * C)
    matrix[:, L:, :C * L] = from_state.permute(1, 3, 2, 0).reshape(H, N, L * C)
    matrix[:, :L, C * L:] = state_from_inputs
    matrix[:, L:, C * L:] = torch.diag_embed(dA * powers[..., -1])  # x'_n from x_n: dA^L
    return matrix


def activated(gating: str, y: Tensor, L: int) -> Tensor:
    """``L C x D`` stage outputs (rows step-major, then output: ``chunk_matrix``'s columns, transposed) ->
    ``MultiHeadSSM.activate``'s ``L x D``, channels in its order."""
    C, D = GATINGS[gating], y.shape[1]
    if gating == "ihg":  # channel c D/2 + h: output c of head-half h gated by h + D/2
        return (y[:, :D // 2] * torch.sigmoid(y[:, D // 2:])).reshape(L, D)
    if gating == "glu":  # the channel's output 0 gated by its output 1
        y = y.reshape(L, C, D)
        return y[:, 0] * torch.sigmoid(y[:, 1])
    return F.gelu(y)


def diagonal_recurrences(ssm: MultiHeadSSM) -> list[DiagonalRecurrence]:
    """Each stage's recurrence (``kernel.recurrence``), checked: real diagonal (MSSM) systems only."""
    recurrences = [kernel.recurrence(1) for kernel in ssm.kernels]
    if not all(type(r) is DiagonalRecurrence for r in recurrences):
        raise UnsupportedModelError(f"an SSM of recurrence {type(recurrences[0]).__name__}: the exporter handles "
                                    "diagonal (MSSM) recurrences")
    return recurrences


class ChunkMultiHeadSSM(nn.Module):
    """A causal ``MultiHeadSSM``'s ``step`` over one chunk of exactly ``length`` frames of one stream.

    ``x``: ``length x D`` (the block's normalised input), ``states``: one ``1 x D x N`` per stage -> ``length x D`` and
    the next states. Equal to ``MultiHeadSSM.step`` on ``1 x length x D`` with those states (eval mode).
    """

    def __init__(self, ssm: MultiHeadSSM, recurrences: list[DiagonalRecurrence], length: int):
        super().__init__()
        if ssm.reverse:
            raise UnsupportedModelError("an anti-causal SSM has no chunk step")
        self.ssm, self.length, self.outputs = ssm, length, GATINGS[ssm.gating]
        self.stages = len(recurrences)
        for i, recurrence in enumerate(recurrences):
            self.register_buffer(f"matrix_{i}", chunk_matrix(recurrence, length))

    def forward(self, x: Tensor, states: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
        LC = self.length * self.outputs
        ssm = self.ssm
        x = x if ssm.in_proj is None else ssm.in_proj(x)
        new_states = []
        for i in range(self.stages):
            state = states[i]
            z = torch.cat([x.t(), state.squeeze(0)], -1).unsqueeze(1)  # D x 1 x (L + N)
            y, new_state = torch.matmul(z, getattr(self, f"matrix_{i}")).split([LC, state.shape[-1]], -1)
            new_states.append(new_state.reshape(state.shape))
            x = activated(self.ssm.gating, y.squeeze(1).t(), self.length)
            if i < len(ssm.linears):
                x = ssm.linears[i](x)
        return x, new_states


class ChunkEncoderLayer(nn.Module):
    """An ``EncoderLayer``'s ``step`` over one chunk of ``length`` frames of one stream: ``x`` ``length x D`` and the
    states of its SSM stages (``state_shapes`` order) -> ``length x D`` and the next states.

    Args:
        layer: a causal layer in eval mode.
        cache: ``layer.step``'s cache after one chunk (each SSM block's ``recurrences`` and ``states``).
        length: frames per chunk at this layer's frame rate.
    """

    def __init__(self, layer: EncoderLayer, cache: dict, length: int):
        super().__init__()
        self.layer = layer
        self.ssms = nn.ModuleDict()
        self.shapes: list[tuple[int, ...]] = []
        for i, block in enumerate(layer.blocks):
            entry = cache.get(i, {})
            recurrences = entry.get("recurrences")
            if recurrences is None:
                continue
            if not isinstance(block.block, MultiHeadSSM):
                raise UnsupportedModelError(f"an SSM block of type {type(block.block).__name__}: the exporter handles "
                                            "causal MultiHeadSSM blocks")
            if not all(type(r) is DiagonalRecurrence for r in recurrences):
                raise UnsupportedModelError(f"an SSM of recurrence {type(recurrences[0]).__name__}: the exporter "
                                            "handles diagonal (MSSM) recurrences")
            self.ssms[str(i)] = ChunkMultiHeadSSM(block.block, recurrences, length)
            self.shapes += [tuple(state.shape) for state in entry["states"]]

    def forward(self, x: Tensor, states: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
        new_states: list[Tensor] = []
        for i, block in enumerate(self.layer.blocks):
            ssm = self.ssms[str(i)] if str(i) in self.ssms else None
            if ssm is None:  # position-wise: no state
                x = block.step(x, {})
                continue
            y, next_states = ssm(block.norm(x), states[:ssm.stages])
            states = states[ssm.stages:]
            new_states += next_states
            x = x + y
        return self.layer.final_norm(x), new_states
