"""SSM math in plain PyTorch: kernels, discretisation, HiPPO, FFT convolution and step mode.

This subpackage imports only torch, so it can be used without fairseq.
"""
from .dss import DSSKernel
from .fft_conv import bidirectional_fft_conv, fft_conv, two_way_fft_conv
from .kernel import SSMKernel, SSMMatrices
from .mssm_kernel import MSSMKernel
from .recurrence import ConjugatePairRecurrence, DenseRecurrence, DiagonalRecurrence, LowRankRecurrence, Recurrence
from .s4 import S4Kernel
from .s4d import S4DKernel

KERNELS = {"s4": S4Kernel, "s4d": S4DKernel, "dss": DSSKernel, "mssm": MSSMKernel}

__all__ = [
    "KERNELS",
    "ConjugatePairRecurrence",
    "DSSKernel",
    "DenseRecurrence",
    "LowRankRecurrence",
    "DiagonalRecurrence",
    "MSSMKernel",
    "Recurrence",
    "S4DKernel",
    "S4Kernel",
    "SSMKernel",
    "SSMMatrices",
    "bidirectional_fft_conv",
    "fft_conv",
    "two_way_fft_conv",
]
