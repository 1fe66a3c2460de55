"""Small instances of every SSM kernel, shared by the kernel, recurrence and convolution tests."""
from ssm_fairseq.ssm import DSSKernel, MSSMKernel, S4DKernel, S4Kernel

KERNEL_CASES = {
    "s4": lambda L: S4Kernel(3, 8, out_channels=2, l_max=L),
    "s4_frozen": lambda L: S4Kernel(3, 8, l_max=L, trainable_A=False, trainable_B=False, trainable_dt=False),
    "s4d_legs": lambda L: S4DKernel(3, 8, out_channels=2),
    "s4d_lin": lambda L: S4DKernel(3, 8, init="lin"),
    "s4d_random": lambda L: S4DKernel(3, 8, init="random"),
    "dss_exp": lambda L: DSSKernel(3, 4, out_channels=2, variant="exp"),
    "dss_softmax": lambda L: DSSKernel(3, 4, out_channels=2, variant="softmax"),
    "dss_softmax_random": lambda L: DSSKernel(3, 4, variant="softmax", init="random"),
    "mssm": lambda L: MSSMKernel(4, 6, out_channels=2, heads=2),
}


def make_kernel(name: str, L: int, dtype=None):
    kernel = KERNEL_CASES[name](L)
    return kernel.to(dtype) if dtype is not None else kernel
