"""A causal SSM sub-layer with a step mode, for decoders: ``Linear(GELU(SSM(x)))``."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...ssm import DSSKernel, MSSMKernel, S4DKernel, S4Kernel, fft_conv

SSM_CHOICES = ("s4", "s4d", "dss", "mssm")


def build_causal_kernel(name: str, dim: int, state_size: int, l_max: int, frozen: bool, heads: int) -> nn.Module:
    """``s4``: S4-LegS (A, B frozen unless ``frozen`` is False); ``s4d``; ``dss`` (DSS-exp: its kernel does not
    depend on the sequence length, so step mode and convolution agree at every length); ``mssm``."""
    if name == "s4":
        return S4Kernel(dim, state_size, l_max=l_max, trainable_A=not frozen, trainable_B=not frozen)
    if name == "s4d":
        return S4DKernel(dim, state_size)
    if name == "dss":
        return DSSKernel(dim, state_size, variant="exp")
    if name == "mssm":
        return MSSMKernel(dim, state_size, heads=heads)
    raise ValueError(f"SSM must be one of {SSM_CHOICES}, got {name!r}")


class CausalSSM(nn.Module):
    """``B x L x D -> B x L x D``: causal SSM convolution (plus ``D u``), GELU, Linear.

    ``step`` continues a sequence from a state with the kernel's recurrence, giving the same outputs as
    ``forward`` on the whole sequence.
    """

    def __init__(self, dim: int, ssm: str = "s4", state_size: int = 64, l_max: int = 4096, frozen: bool = True,
                 heads: int = 1):
        super().__init__()
        self.kernel = build_causal_kernel(ssm, dim, state_size, l_max, frozen, heads)
        self.l_max = l_max
        self.out_proj = nn.Linear(dim, dim)
        self._kept_recurrence: tuple | None = None  # (what the kernel was built from, its recurrence)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """``x``: ``B x L x D``; ``padding_mask``: ``B x L``, True at padded positions."""
        K, D = self.kernel(x.shape[1])
        y = fft_conv(x.transpose(1, 2), K, D, padding_mask)[:, 0]  # B x D x L
        return self.out_proj(F.gelu(y).transpose(1, 2))

    def step(self, x: Tensor, cache: dict) -> Tensor:
        """``x``: ``B x n x D``, the next ``n`` positions; ``cache``: a dict, ``{}`` at the start of a sequence.

        The cache holds the recurrence (``_recurrence``) and the state (``B x D x N``; ``N/2`` for S4, one state of
        each conjugate pair).
        """
        if "recurrence" not in cache:
            cache["recurrence"] = self._recurrence()
            cache["state"] = cache["recurrence"].initial_state(x.shape[0]).to(x.device)
        state = cache["state"]
        y, cache["state"] = cache["recurrence"].chunk(x.transpose(1, 2).to(state.dtype.to_real()), state)
        return self.out_proj(F.gelu(y[:, 0].to(x.dtype)).transpose(1, 2))

    def _recurrence(self):
        """The kernel's step mode at ``l_max``. Building it can cost more than the tokens of a short sequence (S4's
        output matrix solves with ``dA^l_max``), so without autograd it is kept and reused by the next sequences
        while the kernel's parameters and buffers are the same tensors, unmodified (an optimiser step or a loaded
        state dict changes their version counters: it is then built again). With autograd every sequence builds
        its own, so that gradients reach the parameters."""
        if torch.is_grad_enabled():
            return self.kernel.recurrence(self.l_max)
        tensors = [*self.kernel.parameters(), *self.kernel.buffers()]
        built_from = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in tensors)
        if self._kept_recurrence is None or self._kept_recurrence[0] != built_from:
            self._kept_recurrence = built_from, self.kernel.recurrence(self.l_max)
        return self._kept_recurrence[1]
