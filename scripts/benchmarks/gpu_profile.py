#!/usr/bin/env python
"""Where a transducer encoder's step goes on a GPU: busy time against wall time, and the most costly operators.

    python scripts/benchmarks/gpu_profile.py [--device cuda] [--architectures mssm_transducer transformer_transducer]
        [--batches one recipe] [--modes train eval] [--autocast none bf16] [--top 15]

Each registered encoder (``encoders.encoder_step``) runs one training step or inference on one batch: ``one``, a
10 s utterance alone; ``recipe``, the LibriSpeech recipe's batch (``--max-tokens 40000`` of 13.5-15 s utterances,
``encoders.mix_batch_frames``). After two warm-up steps, the best of ``--repeats`` wall times is taken (synchronised),
then one step runs under ``torch.profiler``. Printed per row: the wall time; the time the device was busy (the sum
of its kernels' times, which overlap nothing on one stream); their ratio (a step whose device is busy a small share
of its wall time is bound by the host's launching, not by arithmetic or memory); the kernels launched; and then the
``--top`` operators by the device time they cause (CUDA) or their own CPU time (on CPU, where this script runs at
small sizes only to check that it works, and counts every ATen call, nested ones included), with their calls and
share of the step. ``--autocast bf16`` runs the steps under ``torch.autocast`` in bfloat16, as mixed-precision
training (fairseq's ``--bf16``, or ``--fp16`` with its own loss scaling) runs the model.
"""
from __future__ import annotations

import argparse
import itertools
import time

import torch
from torch.profiler import ProfilerActivity, profile

import encoders

RECIPE_MAX_TOKENS = 40000  # recipes/librispeech/conf/librispeech.sh
RECIPE_UTTERANCE_SECONDS = 15.0


def batch_frames(batch: str, small: bool) -> list[int]:
    """Utterance lengths (feature frames) of the batch named ``batch`` (small sizes off CUDA)."""
    if batch == "one":
        return [100 if small else 1000]
    return encoders.mix_batch_frames(1.0 if small else RECIPE_UTTERANCE_SECONDS, 400 if small else RECIPE_MAX_TOKENS)


def wall_ms(step, device: str, repeats: int) -> float:
    """Best of ``repeats`` synchronised wall times of ``step``, in ms."""
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 1e3 * best


def profiled(step, device: str) -> tuple[float, int, list[tuple[str, int, float]]]:
    """``(busy ms, kernels, [(operator, calls, ms)])`` of one ``step``: device time on CUDA, CPU time elsewhere."""
    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    averages = prof.key_averages()
    if cuda:
        kernels = [e for e in averages if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.self_device_time_total for e in kernels) / 1e3
        launched = sum(e.count for e in kernels)
        operators = [(e.key, e.count, e.device_time_total / 1e3) for e in averages
                     if e.key.startswith("aten::") and e.self_device_time_total > 0]
        return busy, launched, operators
    operators = [(e.key, e.count, e.self_cpu_time_total / 1e3) for e in averages if e.key.startswith("aten::")]
    return sum(ms for _, _, ms in operators), sum(count for _, count, _ in operators), operators


def under_autocast(step, device: str, dtype: str):
    """``step`` run under ``torch.autocast(device, dtype)`` (as it is with ``none``)."""
    if dtype == "none":
        return step

    def autocast_step():
        with torch.autocast(device, dtype=getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[dtype])):
            step()
    return autocast_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--architectures", nargs="+", default=["mssm_transducer", "transformer_transducer"])
    parser.add_argument("--batches", nargs="+", choices=("one", "recipe"), default=["one", "recipe"])
    parser.add_argument("--modes", nargs="+", choices=("train", "eval"), default=["train", "eval"])
    parser.add_argument("--autocast", nargs="+", choices=("none", "bf16", "fp16"), default=["none"])
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    small = args.device != "cuda"
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"# {name}, torch {torch.__version__}: one step of each encoder; busy = "
          f"{'summed kernel time' if args.device == 'cuda' else 'summed operator CPU time'}\n")
    for precision, batch, mode, architecture in itertools.product(args.autocast, args.batches, args.modes,
                                                                   args.architectures):
        frames = batch_frames(batch, small)
        step = under_autocast(encoders.encoder_step(argparse.Namespace(
            architecture=architecture, frames=frames, device=args.device, mode=mode)), args.device, precision)
        step(), step()
        wall = wall_ms(step, args.device, args.repeats)
        busy, launched, operators = profiled(step, args.device)
        seconds = max(frames) / encoders.FRAMES_PER_SECOND
        print(f"## {architecture}, {mode}, autocast {precision}, {len(frames)} x {seconds:g} s: wall {wall:.2f} ms, "
              f"busy {busy:.2f} ms ({100 * busy / wall:.0f}% of wall), "
              f"{launched} {'kernels' if args.device == 'cuda' else 'operators'}\n")
        print("| operator | calls | ms | share of busy |\n|---|---|---|---|")
        for key, count, ms in sorted(operators, key=lambda o: -o[2])[:args.top]:
            print(f"| {key} | {count} | {ms:.2f} | {100 * ms / busy:.0f}% |")
        print(flush=True)

if __name__ == "__main__":
    main()
