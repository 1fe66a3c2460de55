#!/usr/bin/env python
"""Every row of issue 45's GPU table, eager and compiled, each beside its attention reference, in one process.

Rows (``--dry-run`` lists them with their sizes), in this order, each printed as soon as it is measured:

* one MSSM encoder layer against a transformer layer (width 512, 250 frames, batch 1, forward + backward), with the
  GPU kernels each launches (``torch.profiler``, CUDA only);
* the ``mssm_transducer`` encoder (16 layers) against ``transformer_transducer``'s (20), a training step and
  inference, at batch 1 (10 s) and at the LibriSpeech recipe's batch (``--max-tokens 40000``: 26 utterances of
  13.5-15 s, ``encoders.mix_batch_frames``), in utterance-seconds per second as well (``encoders.py``);
* the MSSM masked-LM layer against the sliding-window (256) and full-attention layers at 4096 tokens
  (``mlm_layers.py``);
* SPADE LM generation against ``transformer_lm``, ms per token after an 8192-token context (``spade_lm.py``);
* a ``spade_t5_small`` training step against fairseq's ``transformer`` at 1024 source tokens (``spade_seq2seq.py``);
* last (the first that ``--budget-minutes`` skips), the ``mssm_transducer`` encoder at the recipe's batch once more,
  training and inference, with its MSSM kernels convolved chunk by chunk on the GPU too (``ssm/chunked_conv.py``:
  matrix products instead of FFTs, as on a CPU from ``batched_kernels.CHUNKED_MIN_POSITIONS``; on a GPU the FFT is
  shipped): whether the GPU should take that path as well at this batch.

"compiled" is the opt-in compiled path (``ssm_fairseq/layers/compiled.py``, ``--compile-encoder``): the same
layers through ``torch.compile`` (``--compile-backend``, inductor by default), measured for the layer and batch-1
encoder rows (``--compiled all``: the recipe's batch too; ``none``: no compiled column); its compilation time, the
first call's extra time, is given beside it. ``--one-by-one`` adds the measurement with the GPU's own paths off
(MSSM kernels generated one by one, S4's Cauchy sums in the CPU's chunks), as earlier releases' tables show.
Times are the best of ``--repeats`` in ms; memory the peak above the start (``torch.cuda.max_memory_allocated``; not
measured on CPU, where this script runs at small sizes only to check that it works). Rows not started within
``--budget-minutes`` are named as skipped, and the script then exits with status 1.

On the GPU machines lent to this project (torch and Triton installed, no fairseq, no network), in one call of
under 8 minutes (estimated from the rows' earlier H100/H200 figures plus one compilation per graph; not yet run):

    # here, once: fairseq's Python sources, hydra, omegaconf and antlr4 copied from this environment, bitarray's
    # wheel for the device's Python (3.12) downloaded; fairseq's Cython and C++ extensions are neither built nor
    # needed (nothing measured here imports them)
    echo /.gpu_bundle/ >> .git/info/exclude
    .venv/bin/python scripts/benchmarks/gpu_paths.py --make-bundle .gpu_bundle
    # there (device tool, carry [".gpu_bundle"]):
    PYTHONPATH=.gpu_bundle:. PYTHONUNBUFFERED=1 python3 scripts/benchmarks/gpu_paths.py --device cuda \
        | tee $OUT/gpu_paths.md
"""
from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import encoders
import mlm_layers
import spade_lm
import spade_seq2seq
from measurement import measure
from ssm_fairseq.layers.compiled import compile_layers
from ssm_fairseq.layers.encoder_layer import EncoderLayer, LayerConfig
from ssm_fairseq.ssm import batched_kernels, structured_products

GPU_BATCHED = batched_kernels.BATCHED_DEVICES
GPU_CHUNK = structured_products.CUDA_CAUCHY_CHUNK_ELEMENTS
RECIPE_MAX_TOKENS = 40000  # recipes/librispeech/conf/librispeech.sh
RECIPE_UTTERANCE_SECONDS = 15.0
# what --make-bundle copies: the Python packages fairseq imports that the GPU machines lack (sources only)
BUNDLED_PACKAGES = ("fairseq", "hydra", "omegaconf", "antlr4")
BUNDLED_SUFFIXES = (".py", ".yaml", ".json", ".txt", ".tokens", ".interp")
# packages with compiled parts that fairseq imports: their wheels for the device's Python are downloaded
BUNDLED_WHEELS = ("bitarray",)


def use_gpu_paths(on: bool) -> None:
    """Switch both GPU paths on (as shipped) or off (kernels one by one, the CPU's Cauchy chunk)."""
    batched_kernels.BATCHED_DEVICES = GPU_BATCHED if on else ()
    structured_products.CUDA_CAUCHY_CHUNK_ELEMENTS = GPU_CHUNK if on else structured_products.CAUCHY_CHUNK_ELEMENTS


@contextmanager
def convolved_chunk_by_chunk(device: str):
    """MSSM kernels convolved chunk by chunk on ``device``'s type (``cuda`` for ``cuda:0``) too
    (``batched_kernels.CHUNKED_DEVICES``), at any batch size (``CHUNKED_MIN_POSITIONS`` 0: so that the rows are what
    they say at the small sizes of a CPU check as well; the recipe's batch is above the threshold anyway), while open."""
    devices, fewest = batched_kernels.CHUNKED_DEVICES, batched_kernels.CHUNKED_MIN_POSITIONS
    batched_kernels.CHUNKED_DEVICES = (*devices, torch.device(device).type)
    batched_kernels.CHUNKED_MIN_POSITIONS = 0
    try:
        yield
    finally:
        batched_kernels.CHUNKED_DEVICES, batched_kernels.CHUNKED_MIN_POSITIONS = devices, fewest


def kernel_launches(run, device: str) -> float:
    """GPU kernels one call of ``run`` launches (NaN off CUDA)."""
    if device != "cuda":
        return math.nan
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)


def encoder_layer(kind: str, width: int, args: argparse.Namespace, compiled: bool) -> dict:
    """One layer's forward + backward at 250 frames, batch 1."""
    torch.manual_seed(0)
    layer = EncoderLayer(kind, LayerConfig(dim=width, ffn_dim=4 * width, dropout=0.1)).to(args.device).train()
    if compiled:
        compile_layers([layer], backend=args.compile_backend)
    x = torch.randn(1, 250, width, device=args.device, requires_grad=True)

    def run():
        layer(x).square().mean().backward()

    return {**measure(run, args.device, args.repeats, "time"), "kernels": kernel_launches(run, args.device)}


def transducer_encoder(architecture: str, frames: list[int], mode: str, args: argparse.Namespace,
                       compiled: bool) -> dict:
    """A registered architecture's encoder on one batch (``frames``: utterance lengths), training or inference."""
    result = encoders.measure_encoder(argparse.Namespace(
        architecture=architecture, frames=frames, device=args.device, repeats=args.repeats, what="time", mode=mode,
        compiled=compiled, compile_backend=args.compile_backend))
    return {**result, "audio_seconds": sum(frames) / encoders.FRAMES_PER_SECOND}


def workloads(args: argparse.Namespace) -> list[tuple[str, object, dict, bool]]:
    """``(name, measure(compiled) of the SSM side, {reference name: measure(compiled)}, compilable)``; each measure
    returns a result dict."""
    small = args.device != "cuda"
    width = 64 if small else 512
    ns = argparse.Namespace
    rows = [("MSSM encoder layer, 250 frames, training step",
             lambda c: encoder_layer("mssm", width, args, c),
             {"transformer layer": lambda c: encoder_layer("transformer", width, args, c)}, args.compiled != "none")]
    seconds, max_tokens = (1.0, 400) if small else (10.0, RECIPE_MAX_TOKENS)
    batches = [(f"{seconds:g} s, batch 1", [round(seconds * encoders.FRAMES_PER_SECOND)], args.compiled != "none")]
    recipe_seconds = 1.0 if small else RECIPE_UTTERANCE_SECONDS
    recipe = encoders.mix_batch_frames(recipe_seconds, max_tokens)
    batches.append((f"--max-tokens {max_tokens}, {len(recipe)} x {recipe_seconds:g} s", recipe,
                    args.compiled == "all"))
    for label, frames, compilable in batches:
        for mode, what in (("train", "training step"), ("eval", "inference")):
            def arch(name, frames=frames, mode=mode):
                return lambda c: transducer_encoder(name, frames, mode, args, c)
            rows.append((f"mssm_transducer encoder, {label}, {what}", arch("mssm_transducer"),
                         {"transformer_transducer": arch("transformer_transducer")}, compilable))
    L = 256 if small else 4096

    def mlm(name):
        return lambda c: mlm_layers.measure_layer(ns(width=64 if small else 1024, device=args.device,
                                                     repeats=args.repeats, what="time", layer=name, length=L))
    rows.append((f"MSSM masked-LM layer, {L} tokens, training step", mlm("mssm"),
                 {"sliding window (256)": mlm("local"), "full attention": mlm("transformer")}, False))
    context = 256 if small else 8192
    lm = ns(layers=4, width=256, heads=4, window=128, vocab=1000, device=args.device, length=context,
            new_tokens=8 if small else 64)
    generation = {}  # both models' steps are interleaved in one measurement: the SSM side runs it

    def spade_generation(_):
        generation.update(spade_lm.generation_latency(lm))
        return {"seconds": generation["spade"] / 1e3, "per_token": True}
    rows.append((f"SPADE LM generation, context {context}, per token", spade_generation,
                 {"transformer_lm": lambda _: {"seconds": generation["transformer_lm"] / 1e3, "per_token": True}},
                 False))
    source = 256 if small else 1024

    def seq2seq(name):
        return lambda c: measure(spade_seq2seq.training_run(ns(model=name, length=source, device=args.device)),
                                 args.device, args.repeats, "time")
    rows.append((f"spade_t5_small training step, {source} source tokens", seq2seq("spade_t5_small"),
                 {"transformer": seq2seq("transformer")}, False))
    for mode, what in (("train", "training step"), ("eval", "inference")):  # last: the budget skips them first
        def chunked(c, mode=mode):
            with convolved_chunk_by_chunk(args.device):
                return transducer_encoder("mssm_transducer", recipe, mode, args, c)
        rows.append((f"mssm_transducer encoder, {batches[-1][0]}, {what}, convolved chunk by chunk", chunked,
                     {"transformer_transducer": lambda c, mode=mode: transducer_encoder(
                         "transformer_transducer", recipe, mode, args, c)}, False))
    return rows


def cell(result: dict | None) -> str:
    if result is None:
        return "-"
    text = f"{1e3 * result['seconds']:.2f} ms" + (" per token" if result.get("per_token") else "")
    if "audio_seconds" in result:
        text += f" ({result['audio_seconds'] / result['seconds']:.3g} utterance-s/s)"
    if "peak_mib" in result:
        text += f", {result['peak_mib']:.0f} MiB"
    if not math.isnan(result.get("kernels", math.nan)):
        text += f", {result['kernels']:.0f} kernels"
    if "compile_seconds" in result:
        text += f", compiled in {result['compile_seconds']:.0f} s"
    return text


def measured(run, compiled: bool) -> dict:
    result = run(compiled)
    if compiled:
        result["compile_seconds"] = result["first_seconds"] - result["seconds"]
    return result


def check_callees() -> None:
    """Raise ``RuntimeError`` naming what is missing if a function or architecture the rows use is gone (renamed in
    another script, say): found here in seconds, not minutes into a GPU session."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    callees = {encoders: ("measure_encoder", "mix_batch_frames", "FRAMES_PER_SECOND"), mlm_layers: ("measure_layer",),
               spade_lm: ("generation_latency", "training_run"), spade_seq2seq: ("training_run",)}
    missing = [f"{module.__name__}.{name}" for module, names in callees.items() for name in names
               if not hasattr(module, name)]
    missing += [f"architecture {a}" for a in ("mssm_transducer", "transformer_transducer")
                if a not in ARCH_MODEL_REGISTRY]
    if missing:
        raise RuntimeError(f"gpu_paths.py calls what no longer exists: {', '.join(missing)}")


def make_bundle(target: Path, python_version: str) -> None:
    """Copy ``BUNDLED_PACKAGES``' sources from this environment into ``target`` and unpack ``BUNDLED_WHEELS``'
    wheels for ``python_version`` (downloaded by pip) there: a folder to put on ``PYTHONPATH`` on a machine with
    torch but no fairseq."""
    import importlib.metadata
    import importlib.util

    target.mkdir(parents=True, exist_ok=True)
    for package in BUNDLED_PACKAGES:
        source = Path(importlib.util.find_spec(package).origin).parent
        shutil.rmtree(target / package, ignore_errors=True)
        for file in source.rglob("*"):
            if file.is_file() and file.suffix in BUNDLED_SUFFIXES and "__pycache__" not in file.parts:
                destination = target / package / file.relative_to(source)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(file, destination)
    with tempfile.TemporaryDirectory() as wheels:
        for package in BUNDLED_WHEELS:
            version = importlib.metadata.version(package)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            "--python-version", python_version, "--implementation", "cp",
                            "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                            "--platform", "manylinux2014_x86_64", "-d", wheels, f"{package}=={version}"], check=True)
        for wheel in Path(wheels).glob("*.whl"):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(target)
    print(f"{target}: {', '.join(BUNDLED_PACKAGES + BUNDLED_WHEELS)} for Python {python_version}; on the GPU "
          f"machine: PYTHONPATH={target}:. python3 scripts/benchmarks/gpu_paths.py --device cuda")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compiled", choices=("none", "batch-one", "all"), default="batch-one",
                        help="which rows also measure the compiled path (default: the layer and batch-1 rows)")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend of the compiled rows (aot_eager: no code generation, quick)")
    parser.add_argument("--one-by-one", action="store_true", help="also measure with the GPU's own paths off")
    parser.add_argument("--budget-minutes", type=float, default=7.5,
                        help="start no row after this many minutes (skipped rows are named; exit status 1)")
    parser.add_argument("--dry-run", action="store_true", help="list the rows and their sizes; measure nothing")
    parser.add_argument("--only", nargs="+", metavar="TEXT",
                        help="only the rows whose workload contains one of these texts (a rerun of some rows)")
    parser.add_argument("--make-bundle", type=Path, metavar="DIR",
                        help="write fairseq's sources and dependencies for a machine without fairseq to DIR, and stop")
    parser.add_argument("--bundle-python", default="3.12", help="with --make-bundle: the GPU machine's Python")
    args = parser.parse_args()
    if args.make_bundle:
        make_bundle(args.make_bundle, args.bundle_python)
        return
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    check_callees()
    device = torch.cuda.get_device_name() if args.device == "cuda" and not args.dry_run else args.device
    print(f"device: {device}, torch {torch.__version__}, compiled rows: {args.compiled} ({args.compile_backend})")
    columns = ["workload", *(["GPU paths off"] if args.one_by_one else []), "as shipped", "compiled", "reference"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    skipped = []
    for name, ssm, references, compilable in workloads(args):
        if args.only and not any(text in name for text in args.only):
            continue
        if args.dry_run:
            print(f"| {name} |" + " |" * (len(columns) - 2) + f" {', '.join(references)} |")
            continue
        if time.perf_counter() - start > 60 * args.budget_minutes:
            skipped.append(name)
            print(f"| {name} | skipped: over the {args.budget_minutes:g}-minute budget |", flush=True)
            continue
        cells = []
        if args.one_by_one:
            use_gpu_paths(False)
            cells.append(cell(measured(ssm, False)))
            use_gpu_paths(True)
        cells.append(cell(measured(ssm, False)))
        cells.append(cell(measured(ssm, True)) if compilable else "-")
        refs = []
        for ref_name, reference in references.items():
            text = f"{ref_name}: {cell(measured(reference, False))}"
            if compilable:
                text += f"; compiled {cell(measured(reference, True))}"
            refs.append(text)
        print(f"| {name} | {' | '.join(cells)} | {'; '.join(refs)} |", flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if not args.dry_run:
        print(f"\n{time.perf_counter() - start:.0f} s in all")
    if skipped:
        sys.exit(f"not measured within {args.budget_minutes:g} minutes: {'; '.join(skipped)}")


if __name__ == "__main__":
    main()
