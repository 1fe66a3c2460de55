"""The transducer predictor (prediction network): embedding and LSTM layers with LayerNorm and dropout."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ...layers.dropout import LeanDropout

State = list[tuple[Tensor, Tensor]]  # per layer (h, c), each 1 x B x hidden


class Predictor(nn.Module):
    """Label history -> ``B x U x hidden`` (MSSM paper section 4.1: 3 LSTM layers of 512, LayerNorm, dropout).

    Args:
        vocab_size: embedding rows (the joiner's vocabulary).
        embed_dim, hidden_dim: 512 and 512 in the paper.
        layers: LSTM layers (3), each followed by LayerNorm and dropout.
        dropout: 0.3 in the paper.
        padding_idx: embedding row kept at zero.
    """

    def __init__(
        self, vocab_size: int, embed_dim: int = 512, hidden_dim: int = 512, layers: int = 3, dropout: float = 0.3,
        padding_idx: int | None = None,
    ):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=padding_idx)
        dims = [embed_dim] + [hidden_dim] * layers
        self.lstms = nn.ModuleList(nn.LSTM(d_in, hidden_dim, batch_first=True) for d_in in dims[:-1])
        self.norms = nn.ModuleList(nn.LayerNorm(hidden_dim) for _ in range(layers))
        self.dropout = LeanDropout(dropout)
        self.hidden_dim = hidden_dim

    def forward(self, tokens: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """``tokens``: ``B x U`` labels (start with blank); ``state``: from a previous call, or None for zeros.

        Returns ``(B x U x hidden, new state)``; feeding tokens one at a time with the state gives the same
        outputs as feeding them at once.
        """
        x = self.dropout(self.embedding(tokens))
        new_state = []
        for i, (lstm, norm) in enumerate(zip(self.lstms, self.norms)):
            x, layer_state = self._run_lstm(lstm, x, None if state is None else state[i])
            new_state.append(layer_state)
            x = self.dropout(norm(x))
        return x, new_state

    @staticmethod
    def _run_lstm(lstm: nn.LSTM, x: Tensor, state: tuple[Tensor, Tensor] | None):
        """One LSTM layer; under CPU autocast in float32 (oneDNN has no bf16 LSTM on many CPUs: it fails)."""
        if x.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            with torch.autocast("cpu", enabled=False):
                return lstm(x.float(), None if state is None else tuple(s.float() for s in state))
        return lstm(x, state)
