#!/usr/bin/env python
"""The GPU's own code paths against the paths they replace, each beside its attention reference, in one process.

On a GPU two paths differ from CPU: a bidirectional MSSM layer generates its kernels in one batched call
(``ssm/batched_kernels.py``), and S4's Cauchy sums walk in 64 MiB chunks (``CUDA_CAUCHY_CHUNK_ELEMENTS``) instead
of the CPU's 2 MiB. Each workload they touch is measured twice, "one by one" (no batching, the CPU's chunk) and
"GPU paths" (as shipped), and its reference once, by calling the other benchmark scripts' functions in this one
interpreter (a fresh one costs ~13 s on the GPU machines we used, so the per-configuration children of the other
scripts would not fit a short device session):

* one MSSM encoder layer against a transformer layer (width 512, 250 frames, batch 1, forward + backward), with
  the GPU kernels each launches (``torch.profiler``, on CUDA only);
* the ``mssm_transducer`` encoder (16 layers) against ``transformer_transducer``'s (20 layers), training and
  inference at 10 s and 30 s (``encoders.py``);
* the MSSM masked-LM layer against the sliding-window and full-attention layers at 4k and 16k (``mlm_layers.py``);
* the S4 layer against attention at 16k (``ssm_vs_attention.py``);
* a SPADE LM training step against ``transformer_lm`` at 4k (``spade_lm.py``) and ``spade_t5_small`` against
  ``transformer`` at 4k source tokens (``spade_seq2seq.py``).

Times are the best of ``--repeats`` in ms, memory the peak above the start (``torch.cuda.max_memory_allocated``;
not measured on CPU, where this script runs at small sizes only to check that it works).

    python scripts/benchmarks/gpu_paths.py --device cuda
"""
from __future__ import annotations

import argparse
import math

import torch
from torch.profiler import ProfilerActivity, profile

import encoders
import mlm_layers
import spade_lm
import spade_seq2seq
import ssm_vs_attention
from measurement import measure
from ssm_fairseq.layers.encoder_layer import EncoderLayer, LayerConfig
from ssm_fairseq.ssm import batched_kernels, structured_products

GPU_BATCHED = batched_kernels.BATCHED_DEVICES
GPU_CHUNK = structured_products.CUDA_CAUCHY_CHUNK_ELEMENTS


def use_gpu_paths(on: bool) -> None:
    """Switch both GPU paths on (as shipped) or off (kernels one by one, the CPU's Cauchy chunk)."""
    batched_kernels.BATCHED_DEVICES = GPU_BATCHED if on else ()
    structured_products.CUDA_CAUCHY_CHUNK_ELEMENTS = GPU_CHUNK if on else structured_products.CAUCHY_CHUNK_ELEMENTS


def kernel_launches(run, device: str) -> float:
    """GPU kernels one call of ``run`` launches (NaN off CUDA)."""
    if device != "cuda":
        return math.nan
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)


def encoder_layer(kind: str, width: int, device: str, repeats: int) -> dict:
    torch.manual_seed(0)
    layer = EncoderLayer(kind, LayerConfig(dim=width, ffn_dim=4 * width, dropout=0.1)).to(device).train()
    x = torch.randn(1, 250, width, device=device, requires_grad=True)

    def run():
        layer(x).square().mean().backward()

    return {**measure(run, device, repeats, "time"), "kernels": kernel_launches(run, device)}


def workloads(args: argparse.Namespace) -> list[tuple[str, object, dict]]:
    """(name, measure the SSM side, {reference name: measure it}); each measure returns a result dict."""
    small = args.device != "cuda"
    width, lengths, seconds = (64, (256,), (1,)) if small else (512, (4096, 16384), (10, 30))
    ns = argparse.Namespace
    rows = [("MSSM encoder layer, 250 frames", lambda: encoder_layer("mssm", width, args.device, args.repeats),
             {"transformer layer": lambda: encoder_layer("transformer", width, args.device, args.repeats)})]
    for s in seconds:
        for mode in ("train", "eval"):
            def arch(name, s=s, mode=mode):
                return lambda: encoders.measure_encoder(ns(architecture=name, seconds=s, device=args.device, batch=1,
                                                           repeats=args.repeats, what="time", mode=mode))
            rows.append((f"mssm_transducer encoder, {s} s, {mode}", arch("mssm_transducer"),
                         {"transformer_transducer": arch("transformer_transducer")}))
    for L in lengths:
        def mlm(name, L=L):
            return lambda: mlm_layers.measure_layer(ns(width=64 if small else 1024, device=args.device,
                                                       repeats=args.repeats, what="time", layer=name, length=L))
        rows.append((f"MSSM masked-LM layer, {L} tokens", mlm("mssm"),
                     {"sliding window (256)": mlm("local"), "full attention": mlm("transformer")}))
    long = 512 if small else 16384

    def layer(name):
        return lambda: ssm_vs_attention.measure_layer(name, long, args.device, args.repeats, "time")
    rows.append((f"S4 layer, {long} tokens", layer("S4"), {"attention": layer("attention")}))
    L = 512 if small else 4096  # the closures below read it when called: it must not change after this line
    lm = ns(layers=4, width=256, heads=4, window=128, vocab=1000, device=args.device, length=L)
    def lm_step(name):
        return lambda: measure(spade_lm.training_run(name, lm), args.device, args.repeats, "time")
    rows.append((f"SPADE LM training step, {L} tokens", lm_step("spade"),
                 {"transformer_lm": lm_step("transformer_lm")}))

    def seq2seq(name):
        return lambda: measure(spade_seq2seq.training_run(ns(model=name, length=L, device=args.device)), args.device,
                               args.repeats, "time")
    rows.append((f"spade_t5_small training step, {L} source tokens", seq2seq("spade_t5_small"),
                 {"transformer": seq2seq("transformer")}))
    return rows


def cell(result: dict) -> str:
    text = f"{1e3 * result['seconds']:.1f} ms"
    if "peak_mib" in result:
        text += f", {result['peak_mib']:.0f} MiB"
    if not math.isnan(result.get("kernels", math.nan)):
        text += f", {result['kernels']:.0f} kernels"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"device: {device}, torch {torch.__version__}")
    print("| workload | one by one | GPU paths | speed-up | reference (as shipped) |")
    print("|---|---|---|---|---|")
    for name, ssm, references in workloads(args):
        results = []
        for on in (False, True):
            use_gpu_paths(on)
            results.append(ssm())
        use_gpu_paths(True)
        refs = "; ".join(f"{ref_name}: {cell(reference())}" for ref_name, reference in references.items())
        speed_up = results[0]["seconds"] / results[1]["seconds"]
        print(f"| {name} | {cell(results[0])} | {cell(results[1])} | {speed_up:.2f}x | {refs} |", flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
