#!/usr/bin/env python
"""Where a transducer encoder's time goes: its sub-sampler against the rest (its layers and final norm), for each
registered architecture, beside the reference (the last of ``--architectures``), at the batch ``fairseq-train``
forms.

Each architecture's encoder is built as for training (``encoders.architecture_encoder``: its own depth, width and
sub-sampler; ``mssm_transducer`` has the MSSM paper's multi-scale ``ms`` sub-sampler, six MSSM layers at 10 and 20 ms
frames, ``transformer_transducer`` two strided convolutions). The batch is ``encoders.mix_batch_frames``' batch of
``--seconds`` under ``--max-tokens`` (the LibriSpeech recipe's 40000 frames: 26 utterances of 13.5-15 s). For each
mode (``train``: forward + backward of the output's mean square; ``eval``: no-grad forward in eval mode) two steps
are timed: the whole encoder, and its sub-sampler alone on the same batch (forward + backward of its output's mean
square in training); "the rest" is their difference. Each architecture runs in a fresh interpreter (two encoders'
training at the recipe's batch do not fit one process on a 24 GB machine), each mode's two steps interleaved, the
median of ``--repeats`` calls after one warm-up (``measurement.interleaved_median_ms``), so that a busy spell slows
both parts alike. The ratios are of times (above 1: slower than the reference's part; its speed relative to the
reference is the inverse). Memory is not measured here (``encoders.py`` does).

    .venv/bin/python scripts/benchmarks/encoder_parts.py --repeats 3
"""
from __future__ import annotations

import argparse
import json
from typing import Callable

import torch
from torch import nn

from encoders import FRAMES_PER_SECOND, architecture_encoder, mix_batch_frames, padded_features, unknown_architectures
from measurement import add_measurement_arguments, child, interleaved_median_ms

PARTS = ("encoder", "sub-sampler")


def part_steps(architecture: str, frames: list[int], mode: str, device: str) -> dict[str, Callable[[int], None]]:
    """``{part: step(i)}`` of one architecture's encoder on a batch of utterances of ``frames`` feature frames."""
    torch.manual_seed(0)
    encoder = architecture_encoder(architecture, max(frames)).to(device).train(mode == "train")
    features, lengths = padded_features(frames, device)
    outputs = {"encoder": lambda: encoder(features, lengths)["encoder_out"],
               "sub-sampler": lambda: encoder.subsampler(features, lengths)[0]}

    def step(output, module: nn.Module):
        if mode == "train":
            def train(_):
                module.zero_grad(set_to_none=True)
                output().square().mean().backward()
            return train

        @torch.no_grad()
        def infer(_):
            output()
        return infer
    return {part: step(outputs[part], encoder if part == "encoder" else encoder.subsampler) for part in PARTS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architectures", nargs="+", default=["mssm_transducer", "transformer_transducer"])
    parser.add_argument("--max-tokens", type=int, default=40000)
    parser.add_argument("--seconds", type=float, default=15.0, help="the longest utterance of the batch")
    parser.add_argument("--modes", nargs="+", choices=("train", "eval"), default=["eval", "train"])
    add_measurement_arguments(parser, repeats=3, whats=("time",))
    parser.add_argument("--one", metavar="ARCHITECTURE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = unknown_architectures(args.architectures + ([args.one] if args.one else []))
    if unknown:
        parser.error(f"not registered transducer architectures: {unknown}")
    torch.set_num_threads(args.threads)
    frames = mix_batch_frames(args.seconds, args.max_tokens)
    if args.one:  # a child: one architecture -> {mode: {part: median ms}}
        print(json.dumps({mode: interleaved_median_ms(part_steps(args.one, frames, mode, args.device),
                                                      args.repeats + 1, args.device, skip=1) for mode in args.modes}))
        return
    common = ["--max-tokens", str(args.max_tokens), "--seconds", str(args.seconds), "--modes", *args.modes,
              "--device", args.device, "--repeats", str(args.repeats), "--threads", str(args.threads)]
    reference = args.architectures[-1]
    print(f"# Encoder time by part: {len(frames)} utterances of {min(frames) / FRAMES_PER_SECOND:g}-"
          f"{max(frames) / FRAMES_PER_SECOND:g} s (--max-tokens {args.max_tokens}), device {args.device}, "
          f"{args.threads} threads, median of {args.repeats} calls of each part, interleaved, "
          f"torch {torch.__version__}\n")
    print(f"| mode | encoder | whole ms | sub-sampler ms (share) | the rest ms | whole: time / {reference}'s "
          f"| sub-sampler: time / {reference}'s | the rest: time / {reference}'s |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    measured = {architecture: child(__file__, ["--one", architecture, *common]) for architecture in args.architectures}
    for mode in args.modes:
        parts = {architecture: (ms[mode]["encoder"], ms[mode]["sub-sampler"]) for architecture, ms in measured.items()}
        noise = [architecture for architecture, (whole, sub) in parts.items() if sub >= whole]
        if noise:  # "the rest" would be a difference of noise, not a time
            raise SystemExit(f"{mode}: the sub-sampler alone measured at least the whole encoder for {noise}; "
                             "nothing is printed for this mode: measure a larger batch or more --repeats")
        base_whole, base_sub = parts[reference]
        for architecture, (whole, sub) in parts.items():
            rest, base_rest = whole - sub, base_whole - base_sub
            print(f"| {mode} | {architecture} | {whole:.1f} | {sub:.1f} ({sub / whole:.0%}) | {rest:.1f} "
                  f"| {whole / base_whole:.2f}x | {sub / base_sub:.2f}x | {rest / base_rest:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
