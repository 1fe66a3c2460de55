#!/usr/bin/env python
"""Training throughput and peak memory of speech encoders at equal width and depth.

Each encoder (``mssm``, ``stateformer``, ``transformer``, ``conformer``; ``--encoders`` adds ``s4``) is built
from the same ``LayerConfig`` (width 512, FFN 2048, 8 attention heads, 4 MSSM heads with inter-head gating,
stack 2, ``D_sh`` 32) and the same sub-sampler, so the layers are what differs. Training: one forward+backward
of a batch of utterances of 10 s and 30 s (100 filterbank frames per second); inference: one forward in eval
mode without autograd, what decoding pays (SSM kernels are then generated once and reused). Throughput is input
frames per second. Ratios are against the transformer encoder of the same run. Time and peak memory are measured
as ``measurement.py`` describes (peak memory of training).

``--architectures mssm_transducer transformer_transducer`` measures instead the encoders of registered transducer
architectures as built for training (their own depth, heads and sub-sampler; the paper's Table 2 compares them at
equal parameters: 16 MSSM layers against 20 transformer layers).
"""
from __future__ import annotations

import argparse
import json

import torch

from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

from measurement import add_measurement_arguments, child, in_subprocess, measure
from ssm_fairseq.asr.transducer.model import TransducerConfig, TransducerModel
from ssm_fairseq.layers.encoder_layer import LayerConfig
from ssm_fairseq.asr.encoder.speech_encoder import SpeechEncoder

FRAMES_PER_SECOND = 100


def architecture_encoder(architecture: str, frames: int) -> SpeechEncoder:
    """The encoder of a registered transducer architecture (its defaults, ``max_source_positions = frames``)."""
    options = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[architecture](options)
    cfg = TransducerConfig(**vars(options))
    cfg.max_source_positions = frames
    return TransducerModel.build_encoder(cfg)


def measure_encoder(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    frames = args.seconds * FRAMES_PER_SECOND
    if args.architecture:
        encoder = architecture_encoder(args.architecture, frames).to(args.device)
    else:
        cfg = LayerConfig(dim=args.width, ffn_dim=4 * args.width, dropout=0.1, s4_l_max=args.seconds * 25 + 1)
        encoder = SpeechEncoder(args.encoder, args.layers, cfg, subsampler=args.subsampler,
                                positions=args.encoder in ("transformer", "conformer")).to(args.device)
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
    parser.add_argument("--architectures", nargs="+", metavar="ARCH",
                        help="registered transducer architectures whose encoders to compare instead (the last is "
                             "the reference of the ratios)")
    parser.add_argument("--durations", type=int, nargs="+", default=[10, 30], help="utterance seconds")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--subsampler", default="tr", choices=["conv", "tr", "ms"])
    add_measurement_arguments(parser, repeats=2)
    parser.add_argument("--encoder", help=argparse.SUPPRESS)
    parser.add_argument("--architecture", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("train", "eval"), default="train", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.encoder or args.architecture:
        print(json.dumps(measure_encoder(args)))
        return

    if args.architectures:
        unknown = [a for a in args.architectures if ARCH_MODEL_REGISTRY.get(a) is not TransducerModel]
        if unknown:
            parser.error(f"not registered transducer architectures: {unknown}")
        encoders, reference_name, which = args.architectures, args.architectures[-1], "--architecture"
        shape = "the architectures' own depth, width and sub-sampler"
    else:
        encoders, reference_name, which = args.encoders, "transformer", "--encoder"
        shape = f"{args.layers} layers, width {args.width}, sub-sampler {args.subsampler}"
    print(f"# Encoders, forward+backward: {shape}, batch {args.batch}, device {args.device}, {args.threads} "
          f"threads, torch {torch.__version__}\n")
    print(f"| encoder | utterance | training frames/s | peak MiB | training frames/s vs {reference_name} "
          f"| memory vs {reference_name} | inference frames/s | inference vs {reference_name} |")
    print("|---|---|---|---|---|---|---|---|")
    for seconds in args.durations:
        common = ["--layers", str(args.layers), "--width", str(args.width), "--batch", str(args.batch),
                  "--subsampler", args.subsampler, "--device", args.device, "--repeats", str(args.repeats),
                  "--threads", str(args.threads), "--seconds", str(seconds)]
        rows = {name: in_subprocess(__file__, [which, name, *common]) for name in encoders}
        inference = {name: child(__file__, ["--what", "time", "--mode", "eval", which, name, *common])
                     for name in encoders}
        reference, reference_inference = rows.get(reference_name), inference.get(reference_name)
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
