"""The additive transducer joiner (MSSM paper section 4.1): project, add, activate, one Linear."""
from __future__ import annotations

import torch
from torch import Tensor, nn

ACTIVATIONS = {"tanh": torch.tanh_, "relu": torch.relu_}


class Joiner(nn.Module):
    """``logits[b, t, u] = Linear(act(W_e enc[b, t] + W_p pred[b, u]))``.

    The ``B x T x (U+1)`` lattice is the memory peak of transducer training, so it is built once: one
    ``B x T x (U+1) x joint_dim`` sum, activated in place, and the ``B x T x (U+1) x V`` logits.

    Args:
        encoder_dim: width of the encoder output.
        predictor_dim: width of the predictor output.
        joint_dim: the common projection width (1024 in the paper).
        vocab_size: output units including blank (4097 in the paper).
        activation: ``tanh`` or ``relu``.
    """

    def __init__(self, encoder_dim: int, predictor_dim: int, joint_dim: int, vocab_size: int, activation: str = "tanh"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"joiner activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.encoder_proj = nn.Linear(encoder_dim, joint_dim)
        self.predictor_proj = nn.Linear(predictor_dim, joint_dim)
        self.output = nn.Linear(joint_dim, vocab_size)
        self.activation = ACTIVATIONS[activation]

    def project(self, encoder_out: Tensor, predictor_out: Tensor) -> tuple[Tensor, Tensor]:
        """``B x T x encoder_dim``, ``B x U1 x predictor_dim`` -> ``B x T x joint_dim``, ``B x U1 x joint_dim``."""
        return self.encoder_proj(encoder_out), self.predictor_proj(predictor_out)

    def join(self, encoder_proj: Tensor, predictor_proj: Tensor) -> Tensor:
        """Projected ``B x T x J`` and ``B x U1 x J`` (or any broadcastable pair) -> logits ``... x V``."""
        hidden = encoder_proj.unsqueeze(-2) + predictor_proj.unsqueeze(-3)
        return self.output(self.activation(hidden))

    def step(self, encoder_proj: Tensor, predictor_proj: Tensor) -> Tensor:
        """One lattice node per row, for search: projected ``N x J`` and ``N x J`` -> logits ``N x V``."""
        return self.output(self.activation(encoder_proj + predictor_proj))

    def forward(self, encoder_out: Tensor, predictor_out: Tensor) -> Tensor:
        """``B x T x encoder_dim`` and ``B x U1 x predictor_dim`` -> logits ``B x T x U1 x vocab_size``."""
        return self.join(*self.project(encoder_out, predictor_out))
