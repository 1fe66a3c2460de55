#!/usr/bin/env python
"""Time and peak memory of one masked-LM layer at document lengths: MSSM vs sliding window vs full attention.

Three ``EncoderLayer``s of the masked LM (``ssm_fairseq.text.mssm_roberta``) at width 1024 and FFN 4096, as in
``mssm_roberta_large``: ``mssm`` (bidirectional MSSM block, 8 heads, ``D_sh`` 32, stack 2), ``local``
(sliding-window attention, 16 heads, window 256 = 128 keys per side, Table 4's baseline) and ``transformer``
(full attention through ``scaled_dot_product_attention``, 16 heads). Batch 1, forward+backward, dropout 0 (so
that full attention can use its memory-efficient kernel). Ratios are against the sliding-window layer of the
same run. Time and peak memory are measured as ``measurement.py`` describes.

    python scripts/benchmarks/mlm_layers.py [--lengths 1024 4096 16384] [--device cuda]
"""
from __future__ import annotations

import argparse
import json

import torch

from measurement import add_measurement_arguments, in_subprocess, measure
from ssm_fairseq.layers.encoder_layer import EncoderLayer, LayerConfig

LAYERS = {"mssm": "MSSM", "local": "sliding window (256)", "transformer": "full attention"}


def measure_layer(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    cfg = LayerConfig(dim=args.width, ffn_dim=4 * args.width, attention_heads=16, ssm_heads=8, ssm_state_size=32,
                      attention_window=128, dropout=0.0)
    layer = EncoderLayer(args.layer, cfg).to(args.device).train()
    x = torch.randn(1, args.length, args.width, device=args.device, requires_grad=True)

    def run():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x).square().mean().backward()

    return measure(run, args.device, args.repeats, args.what)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--width", type=int, default=1024)
    add_measurement_arguments(parser, repeats=2)
    parser.add_argument("--layer", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.layer:
        print(json.dumps(measure_layer(args)))
        return

    print(f"# One masked-LM layer, forward+backward: width {args.width}, batch 1, device {args.device}, "
          f"{args.threads} threads, torch {torch.__version__}\n")
    print("| tokens | layer | ms | peak MiB | time vs sliding window | memory vs sliding window |")
    print("|---|---|---|---|---|---|")
    for length in args.lengths:
        common = ["--length", str(length), "--width", str(args.width), "--device", args.device,
                  "--repeats", str(args.repeats), "--threads", str(args.threads)]
        rows = {name: in_subprocess(__file__, ["--layer", name, *common]) for name in LAYERS}
        local = rows["local"]
        for name, r in rows.items():
            print(f"| {length} | {LAYERS[name]} | {1000 * r['seconds']:.0f} | {r['peak_mib']:.0f} "
                  f"| {r['seconds'] / local['seconds']:.2f}x | {r['peak_mib'] / max(local['peak_mib'], 1e-9):.2f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
