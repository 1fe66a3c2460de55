#!/usr/bin/env python
"""SPADE encoder-decoder vs fairseq's ``transformer`` at long source lengths: training step and generation.

Both models have the ``spade_t5_small`` shape (4 + 4 layers of 256, FFN 1024, 4 heads, shared embeddings,
vocabulary 1000); SPADE uses window attention of 64, T5 relative positions and frozen S4 at the bottom of each
stack, fairseq's ``transformer`` full attention with sinusoidal positions. For each source length:

1. One training step (forward + backward, batch 1, 128 target tokens), each model in processes of its own: time
   and peak memory as ``measurement.py`` describes; a configuration that does not run (memory) is reported as such.
2. Greedy incremental generation of 32 tokens, both models (same seed) in one process, each having encoded the
   source once: their single-token steps interleaved, a step of one after a step of the other, and the median
   step time of each reported as ms/token (``interleaved_median_ms`` of ``measurement.py``), the first step
   excluded (it fills the caches: the cross-attention keys and values of the whole source).

    python scripts/benchmarks/spade_seq2seq.py [--lengths 1024 4096 8192 16384] [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Callable

import torch
import torch.nn.functional as F
from fairseq.data import Dictionary

from measurement import add_measurement_arguments, child, in_subprocess, interleaved_median_ms, measure

MODELS = ("spade_t5_small", "transformer")
VOCAB, TARGET, GENERATED = 1000, 128, 32


class _Task:
    def __init__(self):
        self.source_dictionary = self.target_dictionary = Dictionary()
        for i in range(VOCAB - len(self.source_dictionary)):
            self.source_dictionary.add_symbol(f"w{i}")


def build(name: str, length: int):
    if name == "spade_t5_small":
        from ssm_fairseq.text import spade_transformer
        from ssm_fairseq.text.spade_transformer import SpadeTransformerConfig, SpadeTransformerModel

        args = argparse.Namespace(max_source_positions=length, max_target_positions=TARGET + GENERATED)
        spade_transformer.spade_t5_small(args)
        args.share_all_embeddings = True
        return SpadeTransformerModel.build_model(SpadeTransformerConfig(**vars(args)), _Task())
    from fairseq.models.transformer import TransformerModel, base_architecture

    args = argparse.Namespace(
        encoder_embed_dim=256, encoder_ffn_embed_dim=1024, encoder_attention_heads=4, encoder_layers=4,
        decoder_embed_dim=256, decoder_ffn_embed_dim=1024, decoder_attention_heads=4, decoder_layers=4,
        max_source_positions=length + 2, max_target_positions=TARGET + GENERATED + 2, share_all_embeddings=True,
        dropout=0.1)
    base_architecture(args)
    return TransformerModel.build_model(args, _Task())


def training_run(args: argparse.Namespace):
    torch.manual_seed(0)
    model = build(args.model, args.length).to(args.device).train()
    src = torch.randint(4, VOCAB, (1, args.length), device=args.device)
    lengths = torch.tensor([args.length], device=args.device)
    prev = torch.randint(4, VOCAB, (1, TARGET), device=args.device)

    def run():
        model.zero_grad(set_to_none=True)
        logits, _ = model(src, lengths, prev)
        F.cross_entropy(logits.flatten(0, 1), prev.flatten()).backward()

    return run


@torch.no_grad()
def generation_latency(args: argparse.Namespace) -> dict:
    """Median ms per generated token of both models, their steps interleaved in this one process, the first
    (cache-filling) step of each not counted."""
    torch.manual_seed(0)
    src = torch.randint(4, VOCAB, (1, args.length), device=args.device)
    lengths = torch.tensor([args.length], device=args.device)

    def greedy(name: str) -> Callable[[int], None]:
        """A ``name`` model that has encoded ``src``; each step decodes the next token greedily."""
        torch.manual_seed(0)
        model = build(name, args.length).to(args.device).eval()
        encoder_out, state = model.encoder(src, src_lengths=lengths), {}
        tokens = torch.full((1, 1), 2, device=args.device)

        def step(i: int) -> None:
            nonlocal tokens
            logits, _ = model.decoder(tokens, encoder_out, incremental_state=state)
            tokens = torch.cat([tokens, logits[:, -1:].argmax(-1)], 1)

        return step

    return interleaved_median_ms({name: greedy(name) for name in MODELS}, GENERATED, args.device, skip=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192, 16384])
    add_measurement_arguments(parser, repeats=1, whats=("time", "memory", "generation"))
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model:
        if args.what == "generation":
            print(json.dumps(generation_latency(args)))
        else:
            print(json.dumps(measure(training_run(args), args.device, args.repeats, args.what)))
        return

    print(f"# spade_t5_small vs fairseq transformer (4+4 x 256, batch 1, {TARGET} target tokens; generation: median "
          f"of steps 2-{GENERATED}, interleaved), device {args.device}, {args.threads} threads, "
          f"torch {torch.__version__}\n")
    print("| source tokens | model | train step ms | train peak MiB | generation ms/token | train speed-up "
          "| memory ratio |")
    print("|---|---|---|---|---|---|---|")
    missing = []
    for length in args.lengths:
        common = ["--length", str(length), "--device", args.device, "--repeats", str(args.repeats),
                  "--threads", str(args.threads)]
        rows = {}
        for name in MODELS:
            try:
                rows[name] = in_subprocess(__file__, ["--model", name, *common])
            except subprocess.CalledProcessError as error:
                rows[name] = {"failed": f"did not run (exit {error.returncode}: out of memory?)"}
                missing.append(f"{name} training at {length} tokens")
        try:
            generation = child(__file__, ["--what", "generation", "--model", "both", *common])
        except subprocess.CalledProcessError:
            generation = {}
            missing.append(f"generation at {length} tokens")
        reference = rows["transformer"]
        for name, r in rows.items():
            if "failed" in r:
                print(f"| {length} | {name} | {r['failed']} | | | | |", flush=True)
                continue
            ms_per_token = f"{generation[name]:.1f}" if generation else "did not run"
            ratios = "| - | - |"
            if name != "transformer" and "failed" not in reference:
                ratios = (f"| {reference['seconds'] / r['seconds']:.2f}x "
                          f"| {r['peak_mib'] / max(reference['peak_mib'], 1e-9):.2f} |")
            print(f"| {length} | {name} | {1000 * r['seconds']:.0f} | {r['peak_mib']:.0f} | {ms_per_token} "
                  f"{ratios}", flush=True)
    if missing:
        sys.exit(f"not measured: {', '.join(missing)} (see the errors above)")


if __name__ == "__main__":
    main()
