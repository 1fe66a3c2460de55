#!/usr/bin/env python
"""An MSSM kernel's convolution two ways: FFT of the generated kernel against chunk by chunk from its diagonal system.

One MSSM kernel of ``--channels`` channels (8 heads, ``D_sh`` 32, ``C = 2`` outputs as with inter-head gating),
batch 1, forward + backward of the convolution including what each way needs of the kernel:

* ``FFT``: the kernel generated at length ``L`` (``real_vandermonde``) and ``fft_conv`` (what an MSSM block runs on a
  GPU, and on a CPU below ``batched_kernels.CHUNKED_MIN_POSITIONS``);
* ``chunked (T)``: ``chunked_diagonal_conv`` of the discrete system, chunks of ``T`` positions (``chunk_length(L)`` by
  default, ``--chunk-lengths`` to compare others).

The input is ``B x D x L`` contiguous, as the MSSM block's channels-first stages pass it. Time and peak memory as
``measurement.py`` describes; ratios are the FFT's time over each row's.

``--layer`` measures instead one ``mssm_transducer`` encoder layer (width 512, both directions, two stages, as
``encoders.architecture_encoder`` builds it) on batches of ``--positions`` positions (sequences x length) at each
length, inference (no autograd, eval mode) and training (forward + backward), with the convolution forced each way
(``batched_kernels.CHUNKED_MIN_POSITIONS``): what sets that threshold, at the batches ``fairseq-train`` forms
(``--max-tokens 40000`` feature frames are about 10,000 positions after 4x sub-sampling).

    python scripts/benchmarks/chunked_conv.py [--lengths 256 1024 4096 16384] [--chunk-lengths 16 32 64] [--device cuda]
    python scripts/benchmarks/chunked_conv.py --layer --positions 400 2000 10000 --lengths 50 100 250 500 1000
"""
from __future__ import annotations

import argparse
import json

import torch

from encoders import architecture_encoder
from measurement import add_measurement_arguments, child, in_subprocess, measure
from ssm_fairseq.ssm import MSSMKernel, batched_kernels, chunked_conv, fft_conv
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


def measure_layer(args: argparse.Namespace) -> dict:
    """One ``mssm_transducer`` encoder layer on ``args.batch`` sequences of ``args.length`` (the last one 10%
    padding), its convolutions ``args.way``, ``args.mode`` (``train``: forward + backward; ``infer``)."""
    torch.manual_seed(0)
    batched_kernels.CHUNKED_MIN_POSITIONS = 0 if args.way == "chunked" else 2**62
    if args.chunk:
        chunked_conv.chunk_length = lambda L, batch=1: args.chunk
    layer = architecture_encoder("mssm_transducer", 4 * args.length).layers[0].to(args.device)
    x = torch.randn(args.batch, args.length, 512, device=args.device)
    padding_mask = torch.zeros(args.batch, args.length, dtype=torch.bool, device=args.device)
    padding_mask[-1, round(0.9 * args.length):] = True
    layer.train(args.mode == "train")

    def train():
        layer.zero_grad(set_to_none=True)
        layer(x, padding_mask).square().mean().backward()

    @torch.no_grad()
    def infer():
        layer(x, padding_mask)

    return measure(train if args.mode == "train" else infer, args.device, args.repeats, args.what)


def print_layer_table(args: argparse.Namespace) -> None:
    print(f"# mssm_transducer encoder layer (width 512), batches of a fixed number of positions, device {args.device}, "
          f"{args.threads} threads, torch {torch.__version__}; ms best of {args.repeats}, FFT time / this time\n")
    print("| positions | L | batch | way | inference ms | vs FFT | training ms | vs FFT | training peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for positions in args.positions:
        for length in args.lengths:
            batch = max(1, positions // length)
            common = ["--layer", "--length", str(length), "--batch", str(batch), "--device", args.device,
                      "--repeats", str(args.repeats), "--threads", str(args.threads)]
            ways = {"FFT": ["--way", "fft"]}
            for T in dict.fromkeys([chunk_length(length, batch), *args.chunk_lengths]):
                default = " (default)" if T == chunk_length(length, batch) else ""
                ways[f"chunked, T = {T}{default}"] = ["--way", "chunked", "--chunk", str(T)]
            rows = {name: (child_time(["--mode", "infer", *way, *common]),
                           in_subprocess(__file__, ["--mode", "train", *way, *common])) for name, way in ways.items()}
            fft_infer, fft_train = rows["FFT"][0]["seconds"], rows["FFT"][1]["seconds"]
            for name, (infer, train) in rows.items():
                print(f"| {batch * length} | {length} | {batch} | {name} | {1000 * infer['seconds']:.0f} "
                      f"| {fft_infer / infer['seconds']:.2f}x | {1000 * train['seconds']:.0f} "
                      f"| {fft_train / train['seconds']:.2f}x | {train['peak_mib']:.0f} |", flush=True)


def child_time(args: list[str]) -> dict:
    """The time measurement of this script run with ``args`` in a fresh interpreter."""
    return child(__file__, ["--what", "time", *args])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    parser.add_argument("--chunk-lengths", type=int, nargs="*", default=[],
                        help="chunk lengths T to measure besides chunk_length(L)")
    parser.add_argument("--channels", type=int, default=1024)
    parser.add_argument("--layer", action="store_true",
                        help="an mssm_transducer encoder layer on batches of --positions positions, both ways")
    parser.add_argument("--positions", type=int, nargs="+", default=[400, 2000, 10000],
                        help="with --layer: positions per batch (batch = positions / length)")
    add_measurement_arguments(parser, repeats=3)
    parser.add_argument("--way", choices=("fft", "chunked"), help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("train", "infer"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.way:
        print(json.dumps(measure_layer(args) if args.layer else measure_convolution(args)))
        return
    if args.layer:
        print_layer_table(args)
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
