"""Time and peak memory of one forward+backward, shared by the benchmark scripts.

Peak memory is ``torch.cuda.max_memory_allocated`` on a GPU, read in the same interpreter as the time (one
child per configuration). On CPU (``tracemalloc`` cannot see torch's
allocations) it is the growth of the process's peak resident set size (Linux ``/proc``), measured in a fresh
interpreter per configuration so that runs do not share a high-water mark, with glibc's mmap threshold fixed
(``MALLOC_MMAP_THRESHOLD_``) so that freed large buffers return to the system. That setting slows allocation
down, so time is measured in a separate interpreter without it.

A benchmark script calls ``in_subprocess(__file__, [...])`` for each configuration; the child, started with
``--what time|memory`` and the given arguments, calls ``measure(run, device, repeats, what)`` and prints its
JSON result as its last line.

``interleaved_median_ms`` times the single steps of several models (one generated token each) in one process.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

import torch


def add_measurement_arguments(parser: argparse.ArgumentParser, repeats: int, whats: tuple = ("time", "memory")):
    """``--device``, ``--repeats``, ``--threads`` and the hidden ``--what`` that selects a child's measurement."""
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--what", choices=whats, default="time", help=argparse.SUPPRESS)


def status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> int:
    """Reset the peak RSS to the current RSS and return it in KiB."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    return status_kib("VmRSS")


def measure(run: Callable[[], None], device: str, repeats: int, what: str) -> dict:
    """``{"seconds": best of repeats, "first_seconds": the warm-up's}`` or ``{"peak_mib": peak memory above the
    baseline}`` of ``run()``.

    ``run`` is called once first as a warm-up (one-time allocations such as FFT plans are not its memory; a compiled
    model compiles there, so ``first_seconds - seconds`` is its compile time). On a GPU, ``what="time"`` also
    returns ``peak_mib``, the peak of the timed runs (the allocator's counters need no fresh process).
    """
    cuda = device.startswith("cuda")
    start = time.perf_counter()
    run()
    if cuda:
        torch.cuda.synchronize()
    first_seconds = time.perf_counter() - start  # includes one-time costs: compilation, FFT plans, caches
    gc.collect()
    if what == "memory":
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        else:
            base = reset_peak_rss()
        run()
        if cuda:
            torch.cuda.synchronize()
            return {"peak_mib": (torch.cuda.max_memory_allocated() - base) / 2**20}
        return {"peak_mib": (status_kib("VmHWM") - base) / 2**10}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if cuda:
        return {"seconds": min(times), "first_seconds": first_seconds,
                "peak_mib": (torch.cuda.max_memory_allocated() - base) / 2**20}
    return {"seconds": min(times), "first_seconds": first_seconds}


def peak_memory_mib(run: Callable[[], object], device: str) -> float:
    """Peak memory of one call of ``run`` above what was in use before it, in MiB, in this process (CUDA:
    ``max_memory_allocated``; CPU: peak resident set growth, which counts only memory the allocator takes from the
    system during the call, so it is exact for a process that has not yet reached that peak)."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    base = reset_peak_rss()
    run()
    return (status_kib("VmHWM") - base) / 2**10


def interleaved_median_ms(steps: dict[str, Callable[[int], None]], count: int, device: str,
                          skip: int = 0) -> dict[str, float]:
    """Median ms of each of ``steps``' calls ``step(0)`` ... ``step(count - 1)``, the first ``skip`` of them run but
    not counted.

    The steps are interleaved (``i`` of each, in order, then ``i + 1``), so that a busy machine's slow spells hit
    them alike, and the median ignores its spikes; on CUDA each call is timed up to its synchronisation.
    """
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(count):
        for name, step in steps.items():
            start = time.perf_counter()
            step(i)
            if cuda:
                torch.cuda.synchronize()
            if i >= skip:
                seconds[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(times) for name, times in seconds.items()}


def child(script: str, args: list[str], env: dict | None = None) -> dict:
    """Run ``script ARGS`` in a fresh interpreter and return the JSON of its last output line."""
    out = subprocess.run([sys.executable, script, *args], check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def in_subprocess(script: str, args: list[str]) -> dict:
    """Run ``script --what time ARGS`` and ``script --what memory ARGS`` in fresh interpreters; merged JSON.

    With ``--device cuda...`` in ARGS the time child's result already holds the peak memory: one child."""
    if "--device" in args and args[args.index("--device") + 1].startswith("cuda"):
        return child(script, ["--what", "time", *args])
    memory_env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    return {**child(script, ["--what", "time", *args]), **child(script, ["--what", "memory", *args], memory_env)}
