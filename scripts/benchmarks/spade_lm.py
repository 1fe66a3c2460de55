#!/usr/bin/env python
"""SPADE LM against fairseq's ``transformer_lm`` of the same width and depth.

1. Training step (forward + backward of the cross-entropy, batch 1) at 1k, 2k, 4k and 8k tokens per sample:
   time and peak memory.
2. Generation: per-token latency with a context of 512, 2k and 8k tokens, both through fairseq's incremental
   decoding (SPADE: S4 in step mode and the window cache; transformer_lm: its key/value cache). The context is
   fed first (SPADE in one call, transformer_lm token by token, which is what its decoder supports), then the
   two models generate the next ``--new-tokens`` tokens in one process, a step of one after a step of the other,
   and the median latency of each one's single-token steps, all of them, is reported (``interleaved_median_ms`` of
   ``measurement.py``: robust to a busy machine's spikes and to the spread between processes).

Both models: ``--layers`` layers of ``--width`` (FFN 4x, ``--heads`` heads), vocabulary ``--vocab`` with a plain
softmax; SPADE has its frozen S4-LegS global layer at the bottom and window ``--window``. Time and memory are
measured as ``measurement.py`` describes.
"""
from __future__ import annotations

import argparse
import json
from typing import Callable

import torch
import torch.nn.functional as F
from fairseq import models, options
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

import ssm_fairseq  # noqa: F401  (registers spade_lm)
from measurement import add_measurement_arguments, child, in_subprocess, interleaved_median_ms, measure


class _Task:
    def __init__(self, vocab: int):
        self.source_dictionary = self.target_dictionary = Dictionary()
        for i in range(vocab - len(self.source_dictionary)):
            self.source_dictionary.add_symbol(f"w{i}")


def build(model: str, args: argparse.Namespace, tokens_per_sample: int):
    arch = {"spade": "spade_lm", "transformer_lm": "transformer_lm"}[model]
    flags = ["--decoder-layers", str(args.layers), "--decoder-embed-dim", str(args.width),
             "--decoder-ffn-embed-dim", str(4 * args.width), "--decoder-attention-heads", str(args.heads),
             "--dropout", "0.1"]
    if model == "spade":
        flags += ["--attention-window", str(args.window)]
    else:
        flags += ["--decoder-input-dim", str(args.width), "--decoder-output-dim", str(args.width)]
    parsed = options.parse_args_and_arch(
        options.get_training_parser(),
        ["data", "--task", "language_modeling", "--arch", arch, "--tokens-per-sample", str(tokens_per_sample),
         "--max-target-positions", str(tokens_per_sample), *flags],
    )
    cfg = convert_namespace_to_omegaconf(parsed)
    return models.build_model(cfg.model, _Task(args.vocab)).to(args.device)


def training_run(model_name: str, args: argparse.Namespace):
    model = build(model_name, args, args.length).train()
    tokens = torch.randint(4, args.vocab, (1, args.length + 1), device=args.device)

    def run():
        model.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])[0]
        F.cross_entropy(logits.view(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).backward()

    return run


@torch.no_grad()
def generation_latency(args: argparse.Namespace) -> dict:
    """Median ms per new token of both models, their steps interleaved in this one process (the spread between
    processes on a shared machine is larger than the difference measured)."""
    tokens = torch.randint(4, args.vocab, (1, args.length + args.new_tokens), device=args.device)

    def after_context(name: str) -> Callable[[int], None]:
        """A ``name`` model fed the context; its step ``i`` decodes new token ``i``."""
        model, state = build(name, args, args.length + args.new_tokens + 1).eval(), {}
        if name == "spade":
            model.decoder(tokens[:, : args.length], incremental_state=state)
        else:
            for end in range(1, args.length + 1):
                model.decoder(tokens[:, :end], incremental_state=state)

        def step(i: int) -> None:
            model.decoder(tokens[:, : args.length + 1 + i], incremental_state=state)

        return step

    steps = {name: after_context(name) for name in ("spade", "transformer_lm")}
    return interleaved_median_ms(steps, args.new_tokens, args.device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="*", default=[1024, 2048, 4096, 8192],
                        help="tokens of the training steps (none: no training table)")
    parser.add_argument("--contexts", type=int, nargs="*", default=[512, 2048, 8192],
                        help="contexts of the generation latencies (none: no generation table)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--new-tokens", type=int, default=64)
    add_measurement_arguments(parser, repeats=2, whats=("time", "memory", "generation"))
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.model and not args.lengths and not args.contexts:
        parser.error("nothing to measure: give --lengths or --contexts some values")
    torch.set_num_threads(args.threads)
    if args.model:
        if args.what == "generation":
            print(json.dumps(generation_latency(args)))
        else:
            print(json.dumps(measure(training_run(args.model, args), args.device, args.repeats, args.what)))
        return

    common = ["--layers", str(args.layers), "--width", str(args.width), "--heads", str(args.heads), "--window",
              str(args.window), "--vocab", str(args.vocab), "--device", args.device, "--repeats", str(args.repeats),
              "--threads", str(args.threads), "--new-tokens", str(args.new_tokens)]
    print(f"# SPADE LM vs transformer_lm: {args.layers} layers, width {args.width}, {args.heads} heads, window "
          f"{args.window}, vocabulary {args.vocab}, batch 1, device {args.device}, {args.threads} threads, "
          f"torch {torch.__version__}\n")
    if args.lengths:
        print("## Training step (forward + backward)\n")
        print("| tokens | SPADE ms | transformer_lm ms | SPADE MiB | transformer_lm MiB | speed-up | memory ratio |")
        print("|---|---|---|---|---|---|---|")
    for L in args.lengths:
        r = {m: in_subprocess(__file__, ["--model", m, "--length", str(L), *common]) for m in ("spade", "transformer_lm")}
        s, t = r["spade"], r["transformer_lm"]
        print(f"| {L} | {1e3 * s['seconds']:.0f} | {1e3 * t['seconds']:.0f} | {s['peak_mib']:.0f} | "
              f"{t['peak_mib']:.0f} | {t['seconds'] / s['seconds']:.2f}x | {s['peak_mib'] / t['peak_mib']:.2f} |",
              flush=True)
    if args.contexts:
        print("\n## Generation: latency per new token after the context (incremental decoding)\n")
        print("| context | SPADE ms/token | transformer_lm ms/token | speed-up |")
        print("|---|---|---|---|")
    for L in args.contexts:
        r = child(__file__, ["--what", "generation", "--model", "both", "--length", str(L), *common])
        print(f"| {L} | {r['spade']:.2f} | {r['transformer_lm']:.2f} | {r['transformer_lm'] / r['spade']:.2f}x |",
              flush=True)


if __name__ == "__main__":
    main()
