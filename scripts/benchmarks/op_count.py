#!/usr/bin/env python
"""What a step launches: the compute operators each encoder layer and registered encoder dispatches, beside its time.

    python scripts/benchmarks/op_count.py [--layers mssm stateformer transformer conformer] [--width 512]
        [--frames 250] [--architectures mssm_transducer transformer_transducer conformer_transducer] [--seconds 2]
        [--batch 1] [--paths cpu batched] [--top 0] [--by-source]

At speech lengths a GPU step costs what it launches, so the operators a step dispatches are the always-available
proxy of its GPU time (DESIGN.md 3.11). Each workload, one encoder layer (``layers/encoder_layer.py``, the
transducer's width-512 configuration by default, ``--frames`` frames) or the encoder of a registered transducer
architecture (``encoders.architecture_encoder``, ``--seconds`` of audio), runs two steps:

* training: one forward + backward of ``output.square().mean()`` in train mode;
* inference: one forward in eval mode under ``torch.no_grad`` (SSM kernels, a bidirectional block's stage spectra and
  stacked weights then come from what the warm-up kept, ``ssm/inference_cache.py``, as in decoding).

Each is run once as a warm-up, then once under ``OperatorCounter``, a ``TorchDispatchMode`` that sees every ATen
operator below autograd (the backward pass's included, composite operators decomposed into what they run), then
timed (best of ``--repeats``, ``measurement.measure``, no counting mode). Counted is every operator but those that
launch no computation, ``NOT_COMPUTE``: views and aliases (operators whose schema returns an alias of an input,
``OpOverload.is_view``, plus ``detach`` and ``lift_fresh``), metadata queries (``sym_size`` ...), and uninitialised
allocations (``empty`` ...). In-place operators (``copy_``, ``fill_``, ``zero_``) are counted.

``--paths`` chooses how MSSM kernels are generated (``ssm/batched_kernels.py``): ``cpu``, as on a CPU (a layer's or
an encoder's kernels in generations of at most ``GENERATION_BYTES``), and ``batched``, as on a GPU (one generation
per configuration however large: ``BATCHED_DEVICES`` then holds ``cpu`` too). Workloads without MSSM kernels run once, as
the references: ratios are against the transformer layer and ``transformer_transducer``'s encoder. Times are CPU
times (``--threads``) and say nothing of a GPU's; ``--top K`` prints each row's K most dispatched operators.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from contextlib import contextmanager
from typing import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from encoders import FRAMES_PER_SECOND, architecture_encoder
from measurement import measure
from ssm_fairseq.layers.encoder_layer import EncoderLayer, LayerConfig
from ssm_fairseq.ssm import MSSMKernel, batched_kernels

# operators that launch no computation (besides every view, ``OpOverload.is_view``): aliases, metadata, allocations
NOT_COMPUTE = frozenset({
    "detach", "lift_fresh", "alias",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size", "stride", "dim", "numel", "is_same_size",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
})
PATHS = ("cpu", "batched")


class OperatorCounter(TorchDispatchMode):
    """Counts the compute operators dispatched while it is active, by name (``aten.mm``, ``aten.add`` ...) and by the
    source file that dispatched them (``sources``: the innermost calling frame in ``ssm_fairseq``, e.g.
    ``ssm/mssm_system.py``, whose custom backward passes count there too; ``OUTSIDE`` for autograd's own derivatives
    of operators and for the workload's loss)."""

    OUTSIDE = "(autograd's derivatives and the loss)"

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.sources: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not func.is_view and name not in NOT_COMPUTE:
            self.counts[name] += 1
            self.sources[_source_file()] += 1
        return func(*args, **(kwargs or {}))


def _source_file() -> str:
    """The file of ``ssm_fairseq`` nearest the caller on the stack, relative to the package, or ``OUTSIDE``."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if _PACKAGE in path:
            return path.split(_PACKAGE, 1)[1]
        frame = frame.f_back
    return OperatorCounter.OUTSIDE


_PACKAGE = f"{os.sep}ssm_fairseq{os.sep}"


@contextmanager
def kernel_path(path: str):
    """MSSM kernels generated as on a CPU (``cpu``: bounded generations) or as on a GPU (``batched``: unbounded), while
    open."""
    devices = batched_kernels.BATCHED_DEVICES
    if path == "batched":
        batched_kernels.BATCHED_DEVICES = (*devices, "cpu")
    try:
        yield
    finally:
        batched_kernels.BATCHED_DEVICES = devices


def steps(model: nn.Module, inputs: tuple, output: Callable) -> dict[str, Callable[[], None]]:
    """``{"training": forward + backward, "inference": no-grad forward}`` of ``model(*inputs)``, ``output``
    picking the tensor of its result that the training loss reads."""

    def training():
        model.train()
        model.zero_grad(set_to_none=True)
        output(model(*inputs)).square().mean().backward()

    @torch.no_grad()
    def inference():
        model.eval()
        model(*inputs)

    return {"training": training, "inference": inference}


def count_and_time(step: Callable[[], None], repeats: int) -> tuple[OperatorCounter, float]:
    """The operators one call of ``step`` dispatches (after a warm-up call) and its best time in ms."""
    step()
    with OperatorCounter() as counter:
        step()
    return counter, 1e3 * measure(step, "cpu", repeats, "time")["seconds"]


def layer_workload(layer_type: str, width: int, frames: int, batch: int) -> tuple[nn.Module, dict]:
    """One encoder layer on ``B x frames x width`` inputs: the layer and its ``steps``."""
    layer = EncoderLayer(layer_type, LayerConfig(dim=width, ffn_dim=4 * width, dropout=0.1))
    return layer, steps(layer, (torch.randn(batch, frames, width),), lambda y: y)


def encoder_workload(architecture: str, seconds: float, batch: int) -> tuple[nn.Module, dict]:
    """A registered transducer architecture's encoder on ``B`` utterances of ``seconds``: the encoder and its
    ``steps``."""
    frames = round(seconds * FRAMES_PER_SECOND)
    encoder = architecture_encoder(architecture, frames)
    features, lengths = torch.randn(batch, frames, 80), torch.full((batch,), frames)
    return encoder, steps(encoder, (features, lengths), lambda out: out["encoder_out"])


def measure_workload(build: Callable[[], tuple[nn.Module, dict]], paths: list[str], repeats: int) -> dict:
    """``{path: {mode: (operator counts, ms)}}``: each of ``paths`` for a model with MSSM kernels, ``-`` alone for
    one without."""
    torch.manual_seed(0)
    model, modes = build()
    if not any(isinstance(m, MSSMKernel) for m in model.modules()):
        paths = ["-"]
    results = {}
    for path in paths:
        with kernel_path(path):
            results[path] = {mode: count_and_time(step, repeats) for mode, step in modes.items()}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", nargs="*", default=["mssm", "stateformer", "transformer", "conformer"])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--frames", type=int, default=250, help="frames of the layer workloads")
    parser.add_argument("--architectures", nargs="*", metavar="ARCH",
                        default=["mssm_transducer", "transformer_transducer", "conformer_transducer"])
    parser.add_argument("--seconds", type=float, default=2.0, help="audio seconds of the encoder workloads")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=0, help="print each row's TOP most dispatched operators")
    parser.add_argument("--by-source", action="store_true",
                        help="print each row's operators by the ssm_fairseq file that dispatched them")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workloads = {f"{t} layer": lambda t=t: layer_workload(t, args.width, args.frames, args.batch)
                 for t in args.layers}
    workloads.update({f"{a} encoder": lambda a=a: encoder_workload(a, args.seconds, args.batch)
                      for a in args.architectures})
    references = {name: "transformer layer" if name.endswith(" layer") else "transformer_transducer encoder"
                  for name in workloads}
    results = {name: measure_workload(build, args.paths, args.repeats) for name, build in workloads.items()}

    print(f"# Operators dispatched per step (training: forward + backward; inference: no-grad forward) and CPU time: "
          f"layers width {args.width}, {args.frames} frames; encoders {args.seconds:g} s of audio; batch "
          f"{args.batch}; {args.threads} threads, torch {torch.__version__}\n")
    print("| workload | MSSM kernels | training ops | vs reference | training ms | inference ops | vs reference "
          "| inference ms |")
    print("|---|---|---|---|---|---|---|---|")
    details = []
    for name, by_path in results.items():
        reference = results.get(references[name], {}).get("-")
        for path, by_mode in by_path.items():
            cells = []
            for mode, (counter, ms) in by_mode.items():
                total = sum(counter.counts.values())
                ratio = f"{total / sum(reference[mode][0].counts.values()):.2f}x" if reference else "-"
                cells.append(f"{total} | {ratio} | {ms:.1f}")
                if args.top:
                    top = ", ".join(f"{op} {n}" for op, n in counter.counts.most_common(args.top))
                    details.append(f"{name}, {path}, {mode}: {top}")
                if args.by_source:
                    files = ", ".join(f"{file} {n}" for file, n in counter.sources.most_common())
                    details.append(f"{name}, {path}, {mode}, by source: {files}")
            print(f"| {name} | {path} | " + " | ".join(cells) + " |")
    if details:
        print("\n" + "\n".join(details))


if __name__ == "__main__":
    main()
