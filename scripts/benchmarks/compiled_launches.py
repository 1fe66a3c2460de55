#!/usr/bin/env python
"""What a compiled layer launches: the operators and generated kernels of an encoder layer's step, eager and compiled.

    python scripts/benchmarks/compiled_launches.py [--layers mssm stateformer transformer conformer] [--width 512]
        [--frames 250] [--backend inductor] [--threads 2]

``op_count.py`` counts operators under a ``TorchDispatchMode``, which cannot see inside compiled code: inductor's
generated kernels (C++ on a CPU, Triton on a GPU) are not ATen operators. Here both are counted from one profiled
step (``torch.profiler``, CPU), after a warm-up call that also compiles:

* the ATen operators called from outside any other ATen operator (a composite operator such as ``linear`` counts
  once, as one launch of what it runs), except views, aliases and metadata queries (``NOT_LAUNCHES``), and
  conversions that did nothing (``to``, ``contiguous``, ``reshape`` ... without a computing operator below them);
* each call of a kernel inductor generated (``torch._inductor.config.cpp.enable_kernel_profile`` names them in the
  profile: ``graph_N_cpp_fused_...``).

Each layer (``layers/encoder_layer.py``, width ``--width``, ``--frames`` frames, batch 1) runs a training step
(forward + backward of ``output.square().mean()``) and an inference step (eval, no autograd), eager and then
compiled with ``layers/compiled.py`` (what ``--compile-encoder`` does: ``--frames`` is padded to its bucket, 256 for
250). The ratios are against the transformer layer in the same mode (eager against eager, compiled against
compiled) and against the eager transformer layer. The first compiled call's time (mostly compilation) is printed;
nothing else is timed. On a GPU the same steps launch one CUDA kernel per generated kernel and per operator;
``gpu_profile.py`` counts those there.
"""
from __future__ import annotations

import argparse
import logging
import time
from collections import Counter
from typing import Callable

import torch
import torch._inductor.config as inductor_config
from torch.profiler import ProfilerActivity, profile

from op_count import steps
from ssm_fairseq.layers.compiled import compile_layers
from ssm_fairseq.layers.encoder_layer import EncoderLayer, LayerConfig

# ATen operators that launch no computation at any depth: views, aliases, metadata, allocations
NOT_LAUNCHES = frozenset({
    "aten::" + name for name in (
        "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "lift_fresh", "alias",
        "view", "_unsafe_view", "as_strided", "t", "transpose", "permute", "slice", "select", "unsqueeze", "squeeze",
        "expand", "_reshape_alias", "unflatten", "split", "split_with_sizes", "narrow", "unbind", "chunk",
        "view_as_real", "view_as_complex", "_conj", "conj", "resolve_conj", "resolve_neg", "real", "imag", "diagonal",
        "set_", "resize_", "size", "stride", "dim", "numel", "is_same_size", "result_type")})
# operators that run nothing when no computing operator runs below them (a conversion to the same dtype, a view
# where one suffices)
CONDITIONAL = frozenset({"aten::" + name for name in ("to", "contiguous", "reshape", "flatten", "type_as",
                                                       "expand_as", "view_as")})


def _launches(event, children: dict) -> int:
    """1 if the profiled ATen ``event`` (with its descendants) computed something, else 0."""
    if event.name in NOT_LAUNCHES:
        return 0
    if event.name in CONDITIONAL:
        return int(any(_launches(child, children) for child in children.get(id(event), [])))
    return 1


def count_launches(step: Callable[[], None]) -> Counter:
    """The launches of one call of ``step`` (after a warm-up call), by name: top-level ATen operators and generated
    kernels (see the module docstring)."""
    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = list(prof.events())
    children: dict[int, list] = {}
    for event in events:
        if event.cpu_parent is not None:
            children.setdefault(id(event.cpu_parent), []).append(event)
    counts: Counter = Counter()
    for event in events:
        if "cpp_fused" in event.name:
            counts["generated kernels"] += 1
        elif event.name.startswith("aten::"):
            parent = event.cpu_parent
            if parent is None or not parent.name.startswith("aten::"):
                if _launches(event, children):
                    counts[event.name] += 1
    return counts


def measure_layer(layer_type: str, width: int, frames: int, backend: str) -> dict:
    """``{(mode, step): (launches Counter, first call s)}`` for ``mode`` eager and compiled."""
    torch.manual_seed(0)
    layer = EncoderLayer(layer_type, LayerConfig(dim=width, ffn_dim=4 * width, dropout=0.1))
    layer_steps = steps(layer, (torch.randn(1, frames, width),), lambda y: y)
    results = {}
    for mode in ("eager", "compiled"):
        if mode == "compiled":
            compile_layers([layer], backend=backend)
        for name, step in layer_steps.items():
            start = time.perf_counter()
            step()  # the first call: compiles
            first = time.perf_counter() - start
            results[mode, name] = (count_launches(step), first)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", nargs="+", default=["mssm", "stateformer", "transformer", "conformer"])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--frames", type=int, default=250)
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager generates no kernels)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=0, help="print each row's TOP most frequent launches")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("filelock").setLevel(logging.WARNING)  # inductor's cache locks, one line each otherwise
    inductor_config.cpp.enable_kernel_profile = True
    layers = list(dict.fromkeys([*args.layers, "transformer"]))  # the reference is always measured
    results = {layer: measure_layer(layer, args.width, args.frames, args.backend) for layer in layers}

    print(f"# Launches per step (top-level ATen operators + generated kernels), eager and compiled "
          f"({args.backend}): layers width {args.width}, {args.frames} frames, batch 1; {args.threads} threads, "
          f"torch {torch.__version__}\n")
    print("| layer | step | eager | vs transformer eager | compiled | of which generated kernels | vs transformer "
          "compiled | vs transformer eager | first compiled call s |")
    print("|---|---|---|---|---|---|---|---|---|")
    tops = []
    reference = results["transformer"]
    for layer in layers:
        for step in ("training", "inference"):
            eager, _ = results[layer]["eager", step]
            compiled, first = results[layer]["compiled", step]
            eager_reference = sum(reference["eager", step][0].values())
            compiled_reference = sum(reference["compiled", step][0].values())
            print(f"| {layer} | {step} | {sum(eager.values())} | {sum(eager.values()) / eager_reference:.2f}x | "
                  f"{sum(compiled.values())} | {compiled['generated kernels']} | "
                  f"{sum(compiled.values()) / compiled_reference:.2f}x | "
                  f"{sum(compiled.values()) / eager_reference:.2f}x | {first:.1f} |")
            for mode, counts in (("eager", eager), ("compiled", compiled)):
                if args.top:
                    tops.append(f"{layer}, {step}, {mode}: "
                                + ", ".join(f"{op} {n}" for op, n in counts.most_common(args.top)))
    if tops:
        print("\n" + "\n".join(tops))


if __name__ == "__main__":
    main()
