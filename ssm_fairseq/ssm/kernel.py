"""The interface every SSM kernel implements, and its dense-matrix view.

A kernel owns ``H`` channels (each an SSM with ``N`` states and ``C`` outputs) and produces:

* ``forward(L)``: the convolution kernel ``K`` (``C x H x L``) and the skip ``D`` (``C x H``);
* ``recurrence(L)``: the same system in step mode (see ``recurrence.py``);
* ``dense_matrices(L)``: its continuous and discrete matrices as dense tensors, for analysis and tests.

``L`` is the length of the convolution the recurrence reproduces; only kernels whose definition depends on
it (DSS-softmax normalises over ``L``) use it. Kernels compute in float32 (float64 if their parameters are
float64), also under fp16/bf16 autocast and after ``model.half()``.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .discretization import discretize_dense
from .inference_cache import tensors_key
from .recurrence import Recurrence


@dataclass
class SSMMatrices:
    """Dense matrices of ``H`` SSM channels with ``N`` states and ``C`` outputs each.

    ``K_k = dC dA^k dB`` is the convolution kernel; ``D`` the skip term. Complex diagonal systems are
    expanded to their conjugate pairs, so that ``dC dA^k dB`` is real.
    """

    A: Tensor  # H x N x N
    B: Tensor  # H x N
    C: Tensor  # C x H x N
    D: Tensor  # C x H
    dt: Tensor  # H
    dA: Tensor  # H x N x N
    dB: Tensor  # H x N
    dC: Tensor  # C x H x N


class SSMKernel(nn.Module, abc.ABC):
    """Base class of SSM kernels (S4, S4D, DSS, MSSM)."""

    discretization: str = "bilinear"

    def __init__(self, channels: int, state_size: int, out_channels: int = 1):
        super().__init__()
        if channels < 1 or state_size < 1 or out_channels < 1:
            raise ValueError(
                f"channels, state_size and out_channels must be positive, got {channels}, {state_size}, {out_channels}"
            )
        self.channels = channels
        self.state_size = state_size
        self.out_channels = out_channels

    @property
    def real_dtype(self) -> torch.dtype:
        """float64 when the parameters are float64, float32 otherwise (also for fp16/bf16 parameters)."""
        return torch.float64 if self.D.dtype == torch.float64 else torch.float32

    @property
    def complex_dtype(self) -> torch.dtype:
        return torch.complex128 if self.real_dtype == torch.float64 else torch.complex64

    def real(self, t: Tensor) -> Tensor:
        """A real parameter in the compute dtype."""
        return t.to(self.real_dtype)

    def complex(self, t: Tensor) -> Tensor:
        """A complex parameter stored as ``... x 2`` reals, in the compute dtype."""
        return torch.view_as_complex(t.to(self.real_dtype).contiguous())

    def forward(self, L: int) -> tuple[Tensor, Tensor]:
        """Convolution kernel ``K``: ``C x H x L`` and skip ``D``: ``C x H``, in float32 or float64.

        In inference (eval mode, no autograd) the kernel is kept until a parameter changes and reused for any
        length it covers (``prefix_stable``): decoding pays for kernel generation once, not once per batch.
        """
        self.check_length(L)
        with torch.autocast(device_type=self.D.device.type, enabled=False):
            if self.training or torch.is_grad_enabled():
                self._inference_kernel = None
                return self.kernel(L), self.real(self.D)
            return self._cached_kernel(L), self.real(self.D)

    def prefix_stable(self) -> bool:
        """Whether ``kernel(L)`` is the first ``L`` taps of ``kernel(L')`` for every ``L' > L``."""
        return True

    def _cached_kernel(self, L: int) -> Tensor:
        parameters = tensors_key(self.parameters())
        cached = getattr(self, "_inference_kernel", None)
        if cached is not None and cached[0] == parameters:
            length = cached[1].shape[-1]
            if length == L:
                return cached[1]
            if length > L and self.prefix_stable():
                return cached[1][..., :L]
        K = self.kernel(L)
        self._inference_kernel = (parameters, K)
        return K

    def check_length(self, L: int) -> None:
        if not isinstance(L, int) or L < 1:
            raise ValueError(f"kernel length must be a positive int, got {L!r}")

    @abc.abstractmethod
    def kernel(self, L: int) -> Tensor:
        """``C x H x L`` convolution kernel (called by ``forward``, with autocast disabled)."""

    @abc.abstractmethod
    def recurrence(self, L: int) -> Recurrence:
        """Step mode reproducing the length-``L`` convolution."""

    @abc.abstractmethod
    def continuous_matrices(self, L: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Dense ``A``: ``H x N x N``, ``B``: ``H x N``, ``C``: ``C x H x N`` and ``dt``: ``H``."""

    def dense_matrices(self, L: int) -> SSMMatrices:
        """Continuous and discrete matrices; the discrete ones by the textbook dense formulas."""
        self.check_length(L)
        with torch.no_grad(), torch.autocast(device_type=self.D.device.type, enabled=False):
            A, B, C, dt = self.continuous_matrices(L)
            dA, dB = discretize_dense(self.discretization, A, B, dt)
            return SSMMatrices(A, B, C, self.real(self.D), dt, dA, dB, C)
