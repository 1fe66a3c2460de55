#!/usr/bin/env python
"""An MSSM kernel's convolution two ways: FFT of the generated kernel against chunk by chunk from its diagonal system.

One MSSM kernel of ``--channels`` channels (8 heads, ``D_sh`` 32, ``C = 2`` outputs as with inter-head gating),
batch 1, forward + backward of the convolution including what each way needs of the kernel:

* ``FFT``: the kernel generated at length ``L`` (``real_vandermonde``) and ``fft_conv`` (what an MSSM block runs on a
  GPU, and on a CPU below ``batched_kernels.CHUNKED_MIN_LENGTH``);
* ``chunked (T)``: ``chunked_diagonal_conv`` of the discrete system, chunks of ``T`` positions (``chunk_length(L)`` by
  default, ``--chunk-lengths`` to compare others).

The input is ``B x D x L`` contiguous, as the MSSM block's channels-first stages pass it. Time and peak memory as
``measurement.py`` describes; ratios are the FFT's time over each row's.

    python scripts/benchmarks/chunked_conv.py [--lengths 256 1024 4096 16384] [--chunk-lengths 16 32 64] [--device cuda]
"""
from __future__ import annotations

import argparse
import json

import torch

from measurement import add_measurement_arguments, in_subprocess, measure
from ssm_fairseq.ssm import MSSMKernel, fft_conv
from ssm_fairseq.ssm.chunked_conv import chunk_length, chunked_diagonal_conv
from ssm_fairseq.ssm.structured_products import real_vandermonde


def measure_convolution(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    kernel = MSSMKernel(args.channels, 32, out_channels=2, heads=8).to(args.device)
    u = torch.randn(1, args.channels, args.length, device=args.device, requires_grad=True)

    def run():
        kernel.zero_grad(set_to_none=True)
        u.grad = None
        dA, dB, dC = kernel.discrete_system(args.length)
        if args.way == "fft":
            y = fft_conv(u, real_vandermonde(dC * dB, dA, args.length), kernel.D)
        else:
            y = chunked_diagonal_conv(u, dA, dB, dC, kernel.D, chunk=args.chunk)
        y.square().mean().backward()

    return measure(run, args.device, args.repeats, args.what)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    parser.add_argument("--chunk-lengths", type=int, nargs="*", default=[],
                        help="chunk lengths T to measure besides chunk_length(L)")
    parser.add_argument("--channels", type=int, default=1024)
    add_measurement_arguments(parser, repeats=3)
    parser.add_argument("--way", choices=("fft", "chunked"), help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.way:
        print(json.dumps(measure_convolution(args)))
        return

    print(f"# MSSM convolution, {args.channels} channels, C = 2, batch 1, forward + backward, device {args.device}, "
          f"{args.threads} threads, torch {torch.__version__}\n")
    print("| L | way | ms | peak MiB | FFT time / this time |")
    print("|---|---|---|---|---|")
    for length in args.lengths:
        common = ["--length", str(length), "--channels", str(args.channels), "--device", args.device,
                  "--repeats", str(args.repeats), "--threads", str(args.threads)]
        fft = in_subprocess(__file__, ["--way", "fft", *common])
        rows = {"FFT": fft}
        for T in dict.fromkeys([chunk_length(length), *args.chunk_lengths]):
            default = " (default)" if T == chunk_length(length) else ""
            rows[f"chunked, T = {T}{default}"] = in_subprocess(__file__, ["--way", "chunked", "--chunk", str(T), *common])
        for name, r in rows.items():
            print(f"| {length} | {name} | {1000 * r['seconds']:.1f} | {r['peak_mib']:.0f} "
                  f"| {fft['seconds'] / r['seconds']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
