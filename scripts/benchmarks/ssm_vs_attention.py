#!/usr/bin/env python
"""Time and peak memory of SSM layers against full attention, for growing sequence length.

Layers compared (batch 1, width 256, forward + backward):

* ``S4``: in-projection, S4-LegS kernel (N = 64) + FFT convolution, GELU, out-projection;
* ``MSSM``: the same with the MSSM kernel (4 heads, D_sh = 32);
* ``attention``: in-projection to q, k, v, ``scaled_dot_product_attention`` with 8 heads, out-projection.

A second table measures kernel generation alone at L = 16k (forward + backward) against a naive
implementation that materialises the ``H x N x L`` Vandermonde matrix. Time and peak memory are measured
as ``measurement.py`` describes (each configuration in fresh interpreters).
"""
from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch import nn

from measurement import add_measurement_arguments, in_subprocess, measure
from ssm_fairseq.ssm import MSSMKernel, S4Kernel, fft_conv

WIDTH, HEADS, MSSM_HEADS = 256, 8, 4


class SSMLayer(nn.Module):
    """Linear -> SSM convolution -> GELU -> Linear on ``B x L x D`` inputs."""

    def __init__(self, kernel: nn.Module):
        super().__init__()
        self.kernel = kernel
        self.proj_in = nn.Linear(WIDTH, WIDTH)
        self.proj_out = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.proj_in(x).transpose(1, 2)  # B x D x L
        K, D = self.kernel(u.shape[-1])
        y = fft_conv(u, K, D).squeeze(1)  # B x D x L
        return self.proj_out(F.gelu(y).transpose(1, 2))


class AttentionLayer(nn.Module):
    """Full (non-causal) multi-head self-attention through ``scaled_dot_product_attention``."""

    def __init__(self):
        super().__init__()
        self.proj_in = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj_out = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        q, k, v = self.proj_in(x).view(B, L, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj_out(y.transpose(1, 2).reshape(B, L, WIDTH))


class NaiveMSSMKernel(nn.Module):
    """The MSSM kernel with the ``H x N x L`` power matrix built at once, as a memory reference."""

    def __init__(self, kernel: MSSMKernel):
        super().__init__()
        self.inner = kernel

    def forward(self, L: int):
        dA, dB, dC = self.inner.discrete_system(L)
        log_dA = torch.log(dA.to(torch.complex64))
        powers = torch.exp(log_dA.unsqueeze(-1) * torch.arange(L, device=dA.device))  # H x N x L
        return torch.einsum("chn,hnl->chl", (dC * dB).to(powers.dtype), powers).real, self.inner.D


def build(name: str, L: int) -> tuple[nn.Module, bool]:
    """The module to measure and whether it takes a sequence (True) or a kernel length (False)."""
    if name == "S4":
        return SSMLayer(S4Kernel(WIDTH, 64, l_max=L)), True
    if name == "MSSM":
        return SSMLayer(MSSMKernel(WIDTH, 32, heads=MSSM_HEADS)), True
    if name == "attention":
        return AttentionLayer(), True
    if name == "MSSM kernel":
        return MSSMKernel(WIDTH, 32, heads=MSSM_HEADS), False
    if name == "S4 kernel":
        return S4Kernel(WIDTH, 64, l_max=L), False
    if name == "naive MSSM kernel":
        return NaiveMSSMKernel(MSSMKernel(WIDTH, 32, heads=MSSM_HEADS)), False
    raise ValueError(name)


def measure_layer(name: str, L: int, device: str, repeats: int, what: str) -> dict:
    """Seconds per forward+backward (best of ``repeats``) or peak memory in MiB above the baseline."""
    torch.manual_seed(0)
    module, takes_sequence = build(name, L)
    module.to(device)

    def run():
        if takes_sequence:
            out = module(torch.randn(1, L, WIDTH, device=device, requires_grad=True))
        else:
            out = module(L)[0]
        out.float().square().mean().backward()

    return measure(run, device, repeats, what)


def measure_in_subprocess(name: str, L: int, device: str, repeats: int, threads: int) -> dict:
    return in_subprocess(__file__, ["--one", name, str(L), "--device", device, "--repeats", str(repeats),
                                    "--threads", str(threads)])


def fitted_exponent(lengths: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(time) against log(L)."""
    x = [math.log(L) for L in lengths]
    y = [math.log(s) for s in seconds]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    add_measurement_arguments(parser, repeats=3)
    parser.add_argument("--one", nargs=2, metavar=("LAYER", "L"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(measure_layer(args.one[0], int(args.one[1]), args.device, args.repeats, args.what)))
        return

    layers = ["S4", "MSSM", "attention"]
    results = {name: [] for name in layers}
    print(f"# SSM layers vs full attention: batch 1, width {WIDTH}, forward+backward, device {args.device}, "
          f"{args.threads} threads, torch {torch.__version__}\n")
    print("| L | S4 ms | MSSM ms | attention ms | S4 MiB | MSSM MiB | attention MiB | attn/S4 time | attn/MSSM time "
          "| S4/attn mem | MSSM/attn mem |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for L in args.lengths:
        row = {name: measure_in_subprocess(name, L, args.device, args.repeats, args.threads) for name in layers}
        for name in layers:
            results[name].append(row[name])
        s4, ms, at = row["S4"], row["MSSM"], row["attention"]
        print(f"| {L} | {1e3 * s4['seconds']:.1f} | {1e3 * ms['seconds']:.1f} | {1e3 * at['seconds']:.1f} "
              f"| {s4['peak_mib']:.0f} | {ms['peak_mib']:.0f} | {at['peak_mib']:.0f} "
              f"| {at['seconds'] / s4['seconds']:.2f}x | {at['seconds'] / ms['seconds']:.2f}x "
              f"| {s4['peak_mib'] / max(at['peak_mib'], 1e-9):.3f} | {ms['peak_mib'] / max(at['peak_mib'], 1e-9):.3f} |",
              flush=True)
    if len(args.lengths) > 1:  # a slope needs two lengths
        print("\nFitted exponent of time against L "
              f"({args.lengths[0]}..{args.lengths[-1]}): "
              + ", ".join(f"{name} {fitted_exponent(args.lengths, [r['seconds'] for r in results[name]]):.2f}"
                          for name in layers))

    L = args.lengths[-1]
    print(f"\n# Kernel generation alone at L = {L} (width {WIDTH}, forward+backward)\n")
    print("| kernel | ms | peak MiB |")
    print("|---|---|---|")
    for name in ["MSSM kernel", "naive MSSM kernel", "S4 kernel"]:
        r = measure_in_subprocess(name, L, args.device, args.repeats, args.threads)
        print(f"| {name} | {1e3 * r['seconds']:.1f} | {r['peak_mib']:.0f} |", flush=True)
    naive_bytes = WIDTH * 32 * L * 8
    print(f"\nA single H x N x L complex64 tensor for the MSSM kernel is {naive_bytes / 2**20:.0f} MiB "
          f"(S4, N/2 = 32 complex states: the same).")


if __name__ == "__main__":
    main()
