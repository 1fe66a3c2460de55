#!/usr/bin/env python
"""Training throughput and peak memory of speech encoders at equal width and depth.

Each encoder (``mssm``, ``stateformer``, ``transformer``, ``conformer``; ``--encoders`` adds ``s4``) is built
from the same ``LayerConfig`` (width 512, FFN 2048, 8 attention heads, 4 MSSM heads with inter-head gating,
stack 2, ``D_sh`` 32) and the same sub-sampler, so the layers are what differs. Training: one forward+backward
of a batch of utterances of 10 s and 30 s (100 filterbank frames per second); inference: one forward in eval
mode without autograd, what decoding pays (SSM kernels are then generated once and reused). Throughput is input
frames per second. Ratios are against the transformer encoder of the same run. Time and peak memory are measured
as ``measurement.py`` describes (peak memory of training).
"""
from __future__ import annotations

import argparse
import json

import torch

from measurement import add_measurement_arguments, child, in_subprocess, measure
from ssm_fairseq.modules.encoder_layer import LayerConfig
from ssm_fairseq.modules.speech_encoder import SpeechEncoder

FRAMES_PER_SECOND = 100


def measure_encoder(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    cfg = LayerConfig(dim=args.width, ffn_dim=4 * args.width, dropout=0.1, s4_l_max=args.seconds * 25 + 1)
    encoder = SpeechEncoder(args.encoder, args.layers, cfg, subsampler=args.subsampler,
                            positions=args.encoder in ("transformer", "conformer")).to(args.device)
    frames = args.seconds * FRAMES_PER_SECOND
    features = torch.randn(args.batch, frames, 80, device=args.device)
    lengths = torch.full((args.batch,), frames, device=args.device)

    def train():
        encoder.zero_grad(set_to_none=True)
        encoder(features, lengths)["encoder_out"].square().mean().backward()

    @torch.no_grad()
    def infer():
        encoder(features, lengths)

    encoder.train(args.mode == "train")
    return measure(train if args.mode == "train" else infer, args.device, args.repeats, args.what)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoders", nargs="+", default=["mssm", "stateformer", "transformer", "conformer"])
    parser.add_argument("--durations", type=int, nargs="+", default=[10, 30], help="utterance seconds")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--subsampler", default="tr", choices=["conv", "tr", "ms"])
    add_measurement_arguments(parser, repeats=2)
    parser.add_argument("--encoder", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("train", "eval"), default="train", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.encoder:
        print(json.dumps(measure_encoder(args)))
        return

    print(f"# Encoders, forward+backward: {args.layers} layers, width {args.width}, batch {args.batch}, "
          f"sub-sampler {args.subsampler}, device {args.device}, {args.threads} threads, torch {torch.__version__}\n")
    print("| encoder | utterance | training frames/s | peak MiB | training frames/s vs transformer "
          "| memory vs transformer | inference frames/s | inference vs transformer |")
    print("|---|---|---|---|---|---|---|---|")
    for seconds in args.durations:
        common = ["--layers", str(args.layers), "--width", str(args.width), "--batch", str(args.batch),
                  "--subsampler", args.subsampler, "--device", args.device, "--repeats", str(args.repeats),
                  "--threads", str(args.threads), "--seconds", str(seconds)]
        rows = {name: in_subprocess(__file__, ["--encoder", name, *common]) for name in args.encoders}
        inference = {name: child(__file__, ["--what", "time", "--mode", "eval", "--encoder", name, *common])
                     for name in args.encoders}
        reference, reference_inference = rows.get("transformer"), inference.get("transformer")
        for name, r in rows.items():
            fps = args.batch * seconds * FRAMES_PER_SECOND / r["seconds"]
            eval_fps = args.batch * seconds * FRAMES_PER_SECOND / inference[name]["seconds"]
            ratios = "| - | - |"
            if reference:
                ratios = (f"| {reference['seconds'] / r['seconds']:.2f}x "
                          f"| {r['peak_mib'] / max(reference['peak_mib'], 1e-9):.2f}x |")
            eval_ratio = f"{reference_inference['seconds'] / inference[name]['seconds']:.2f}x" if reference else "-"
            print(f"| {name} | {seconds} s | {fps:.0f} | {r['peak_mib']:.0f} {ratios} {eval_fps:.0f} | {eval_ratio} |",
                  flush=True)


if __name__ == "__main__":
    main()
