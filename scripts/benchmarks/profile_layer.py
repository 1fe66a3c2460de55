#!/usr/bin/env python
"""Where the time of one encoder layer goes: a torch.profiler breakdown by part, forward and backward.

    python scripts/benchmarks/profile_layer.py [--layers mssm stateformer transformer] [--frames 250 750]
        [--batch 1 8] [--width 512] [--device cpu|cuda]

Each layer (``layers/encoder_layer.py``, the transducer's width-512 configuration by default) runs one
forward+backward after a warm-up under ``torch.profiler``. Forward time is attributed through
``record_function`` ranges around the layer's parts (SSM kernel generation, convolution (FFT, or chunk by chunk
from 2048 frames on a CPU), linears,
attention, layer norms, dropout); backward time through the autograd nodes that run (``AddmmBackward`` is a
linear, ``LinalgEighBackward`` kernel generation, ...). What no part claims is "other" (gating, activations,
residual additions, copies). Times are the profiler's CPU times (with its overhead), for proportions, not for
speed; with ``--device cuda`` they are host-side (launch) times, not kernel times. The ``operators`` column counts
what one forward+backward launches: the top-level ATen operators on CPU, the GPU kernels with ``--device cuda``.
Where each costs more to launch than to compute (a GPU at these sizes), time follows this count.
``--batched-kernels`` generates each layer's MSSM kernels in one call as on a GPU (``ssm/batched_kernels.py``;
on CPU they are generated one by one), to count that path's operators on CPU.
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from contextlib import contextmanager

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from ssm_fairseq.layers.state_space import bidirectional_ssm, multihead_ssm
from ssm_fairseq.ssm import batched_kernels
from ssm_fairseq.layers.encoder_layer import EncoderLayer, LayerConfig
from ssm_fairseq.layers.attention.local_attention import LocalAttention
from ssm_fairseq.layers.attention.self_attention import SelfAttention
from ssm_fairseq.ssm.kernel import SSMKernel

PARTS = ("kernel generation", "convolution", "linears", "attention", "layer norm", "dropout")
BACKWARD = "autograd::engine::evaluate_function: "
# our custom autograd Functions, whose backward nodes have no forward op to take a part from
CUSTOM_FUNCTIONS = {"_SpectralConvolution": "convolution", "_StatesBeforeChunks": "convolution",
                    "_KernelSpectrum": "convolution", "_TwoWaySpectra": "convolution",
                    "_RealVandermonde": "kernel generation", "_ChannelsMerged": "kernel generation",
                    "_Cauchy": "kernel generation"}


def _labelled(module: nn.Module, label: str) -> None:
    """Run ``module``'s forward inside ``record_function(label)``."""
    forward = module.forward

    def wrapped(*args, **kwargs):
        with record_function(label):
            return forward(*args, **kwargs)

    module.forward = wrapped


# module-level functions that the MSSM block calls by name, and the part each belongs to
LABELLED_FUNCTIONS = ((multihead_ssm, "convolve", "convolution"),
                      (multihead_ssm, "linear_channels_first", "linears"),
                      (multihead_ssm, "layer_kernels", "kernel generation"),
                      (bidirectional_ssm, "layer_kernels", "kernel generation"),
                      (bidirectional_ssm, "two_way_fft_conv", "convolution"),
                      (bidirectional_ssm, "two_way_spectra", "convolution"),
                      (bidirectional_ssm, "_two_linears", "linears"))


@contextmanager
def labelled_functions():
    """Run each of ``LABELLED_FUNCTIONS`` inside ``record_function(its part)`` while the context is open."""
    originals = [getattr(module, name) for module, name, _ in LABELLED_FUNCTIONS]

    def labelled(function, label):
        def wrapped(*args, **kwargs):
            with record_function(label):
                return function(*args, **kwargs)
        return wrapped

    for (module, name, label), original in zip(LABELLED_FUNCTIONS, originals):
        setattr(module, name, labelled(original, label))
    try:
        yield
    finally:
        for (module, name, _), original in zip(LABELLED_FUNCTIONS, originals):
            setattr(module, name, original)


def label_parts(layer: nn.Module) -> None:
    for module in layer.modules():
        if isinstance(module, SSMKernel):
            _labelled(module, "kernel generation")
        elif isinstance(module, (SelfAttention, LocalAttention)):
            _labelled(module, "attention")  # its projections are counted as linears inside
        elif isinstance(module, nn.Linear):
            _labelled(module, "linears")
        elif isinstance(module, nn.LayerNorm):
            _labelled(module, "layer norm")
        elif isinstance(module, nn.Dropout):
            _labelled(module, "dropout")


def breakdown(layer_type: str, frames: int, batch: int, width: int, device: str) -> tuple[dict, float, int]:
    """``({part: milliseconds}, total milliseconds, operators launched)`` of one forward+backward."""
    torch.manual_seed(0)
    cfg = LayerConfig(dim=width, ffn_dim=4 * width, dropout=0.1)
    layer = EncoderLayer(layer_type, cfg).to(device).train()
    label_parts(layer)
    x = torch.randn(batch, frames, width, device=device, requires_grad=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with labelled_functions():
        layer(x).square().mean().backward()  # warm-up
        with profile(activities=activities) as prof:
            with record_function("total"):
                layer(x).square().mean().backward()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
    return (*attribute(prof.events()), operator_count(prof.events(), device))


def operator_count(events, device: str) -> int:
    """GPU kernels launched (CUDA), or ATen operators called from outside another ATen operator (CPU)."""
    if device.startswith("cuda"):
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in events
               if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def _part(event) -> str | None:
    """The innermost labelled range around ``event`` (None: outside every part)."""
    while event is not None and event.name not in PARTS:
        event = event.cpu_parent
    return None if event is None else event.name


def _ancestors(event):
    while event.cpu_parent is not None:
        event = event.cpu_parent
        yield event


def attribute(events) -> tuple[dict, float]:
    """``({part: ms}, total ms)``. Forward: the time of each labelled range less the labelled ranges inside it
    (a linear inside attention is a linear). Backward: each autograd node goes to the part of the forward op
    with its sequence number; our custom autograd Functions by their names."""
    times: dict[str, float] = defaultdict(float)
    forward_part = {e.sequence_nr: _part(e) for e in events
                    if e.sequence_nr >= 0 and not e.name.startswith(BACKWARD) and _part(e)}
    total = 0.0
    for e in events:
        ms = e.cpu_time_total / 1000
        if e.name == "total":
            total = ms
        elif e.name in PARTS:
            times[e.name] += ms
            outer = _part(e.cpu_parent) if e.cpu_parent is not None else None
            if outer is not None:
                times[outer] -= ms
        elif e.name.startswith(BACKWARD) and not any(a.name.startswith(BACKWARD) for a in _ancestors(e)):
            part = forward_part.get(e.sequence_nr)
            if part is None:
                part = next((p for name, p in CUSTOM_FUNCTIONS.items() if f": {name}Backward" in e.name), None)
            if part is not None:
                times[part] += ms
    times["other"] = max(0.0, total - sum(times.values()))
    return dict(times), total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", nargs="+", default=["mssm", "stateformer", "transformer"])
    parser.add_argument("--frames", type=int, nargs="+", default=[250, 750])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batched-kernels", action="store_true",
                        help="generate each layer's MSSM kernels in one call, as on a GPU")
    args = parser.parse_args()
    if args.batched_kernels:
        batched_kernels.BATCHED_DEVICES = (torch.device(args.device).type,)
    torch.set_num_threads(args.threads)
    columns = (*PARTS, "other")
    print(f"# One encoder layer, forward+backward, width {args.width}, device {args.device}, {args.threads} threads, "
          f"torch {torch.__version__}: share of the profiled time (ms total)\n")
    print("| layer | frames | batch | operators | total ms | " + " | ".join(columns) + " |")
    print("|---" * (5 + len(columns)) + "|")
    for layer_type in args.layers:
        for frames in args.frames:
            for batch in args.batch:
                times, total, operators = breakdown(layer_type, frames, batch, args.width, args.device)
                shares = " | ".join(f"{100 * times.get(c, 0.0) / total:.0f}%" for c in columns)
                print(f"| {layer_type} | {frames} | {batch} | {operators} | {total:.0f} | {shares} |", flush=True)


if __name__ == "__main__":
    main()
