"""Plot the learned MSSM kernels of a checkpoint, one curve per head (the MSSM paper's Figure 4).

    ssm-plot-kernels CHECKPOINT --layer N [--heads 0 1 2] [--stage 0] [--length 256] -o kernels.png

(``python scripts/plot_kernels.py`` in the repository runs the same ``main``; needs matplotlib, the ``plots``
extra.)

Works for any checkpoint whose layers hold a bidirectional MSSM block (``mssm_roberta``, ``mssm_transducer``,
``stateformer_transducer``): the kernels are rebuilt from the checkpoint's parameters with the library's
``MSSMKernel``. The forward (causal) direction is drawn at lags ``0 .. L-1``, the backward (anti-causal) one at
``-(L-1) .. 0``. A head's curve is the mean of its channels' kernels (``--channel mean``) or one channel.
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

import torch

from ssm_fairseq.atomic_files import replacing
from ssm_fairseq.ssm import MSSMKernel

logger = logging.getLogger("plot_kernels")
DIRECTIONS = ("forward_ssm", "backward_ssm")


def kernel_prefixes(state: dict, layer: int, stage: int) -> dict[str, str]:
    """``{direction: parameter prefix}`` of the stage-``stage`` MSSM kernels of ``layers.{layer}`` in ``state``."""
    found = {}
    for key in state:
        match = re.fullmatch(rf"(.*(?:^|\.)layers\.{layer}\.(?:.*\.)?({'|'.join(DIRECTIONS)})\.kernels\.{stage}\.)"
                             r"z_lambda", key)
        if match:
            found[match.group(2)] = match.group(1)
    return found


def layers_with_kernels(state: dict) -> list[int]:
    """Indices ``N`` of the ``layers.N`` that hold MSSM kernels."""
    pattern = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:.*\.)?(?:forward|backward)_ssm\.kernels\.\d+\.z_lambda$")
    return sorted({int(m.group(1)) for key in state if (m := pattern.search(key))})


def rebuild_kernel(state: dict, prefix: str) -> MSSMKernel:
    """The ``MSSMKernel`` whose parameters are ``state[prefix + name]``."""
    params = {name: state[prefix + name].float() for name in ("z_lambda", "p", "B", "C", "D", "z_dt")}
    heads, state_size = params["z_lambda"].shape
    out_channels, channels, _ = params["C"].shape
    kernel = MSSMKernel(channels, state_size, out_channels, heads=heads)
    kernel.load_state_dict(params)
    return kernel


def head_curves(kernel: MSSMKernel, length: int, output: int = 0, channel: int | None = None) -> torch.Tensor:
    """``heads x length``: per head, the kernel of output ``output`` averaged over the head's channels (or of
    its ``channel``-th channel)."""
    with torch.no_grad():
        K, _ = kernel(length)  # C x H x L
    per_head = K[output].view(kernel.heads, kernel.channels // kernel.heads, length)
    return per_head.mean(1) if channel is None else per_head[:, channel]


def plot(curves: dict[str, torch.Tensor], heads: list[int], title: str, out: Path) -> None:
    """Both directions of the selected heads on one axis: backward at negative lags, forward at positive."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for h in heads:
        color = f"C{h % 10}"
        if "forward_ssm" in curves:
            k = curves["forward_ssm"][h]
            ax.plot(range(len(k)), k, color=color, label=f"head {h}")
        if "backward_ssm" in curves:
            k = curves["backward_ssm"][h]
            ax.plot(range(0, -len(k), -1), k, color=color, linestyle="--",
                    label=None if "forward_ssm" in curves else f"head {h}")
    ax.axvline(0, color="grey", linewidth=0.5)
    ax.set_xlabel("lag (negative: backward direction, dashed)")
    ax.set_ylabel("kernel value")
    ax.set_title(title)
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    with replacing(out) as temporary:  # a failed plot leaves the old file
        fig.savefig(temporary, dpi=120, format=out.suffix[1:] or matplotlib.rcParams["savefig.format"])
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--layer", type=int, required=True, help="index N of the model's layers.N")
    parser.add_argument("--heads", type=int, nargs="+", help="heads to draw (default: all)")
    parser.add_argument("--stage", type=int, default=0, help="stage of the stacked MSSM (0 = the first)")
    parser.add_argument("--length", type=int, default=256, help="number of lags")
    parser.add_argument("--output-channel", type=int, default=0, help="output expansion row (0 or 1 with gating)")
    parser.add_argument("--channel", default="mean", help="'mean' over a head's channels, or a channel index in it")
    parser.add_argument("-o", "--output", type=Path, required=True, help="PNG to write")
    args = parser.parse_args(argv)
    if args.length < 1:
        parser.error(f"--length must be at least 1 lag, got {args.length}")
    logging.basicConfig(format="%(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    from fairseq import checkpoint_utils

    import ssm_fairseq  # noqa: F401  (allow-lists what our checkpoints hold)

    if not args.checkpoint.is_file():
        sys.exit(f"plot_kernels: no such checkpoint: {args.checkpoint}")
    state = checkpoint_utils.load_checkpoint_to_cpu(str(args.checkpoint))["model"]
    prefixes = kernel_prefixes(state, args.layer, args.stage)
    if not prefixes:
        sys.exit(f"plot_kernels: {args.checkpoint} has no stage-{args.stage} MSSM kernels in layer {args.layer}; "
                 f"layers with MSSM kernels: {layers_with_kernels(state) or 'none'}")
    curves = {}
    for direction, prefix in sorted(prefixes.items()):
        logger.info("%s: %s*", direction, prefix)
        kernel = rebuild_kernel(state, prefix)
        heads = args.heads if args.heads is not None else list(range(kernel.heads))
        if not all(0 <= h < kernel.heads for h in heads):
            sys.exit(f"plot_kernels: layer {args.layer} has {kernel.heads} heads, asked for {heads}")
        if not 0 <= args.output_channel < kernel.out_channels:
            sys.exit(f"plot_kernels: layer {args.layer}'s kernels have {kernel.out_channels} output rows, "
                     f"asked for --output-channel {args.output_channel}")
        channel = None if args.channel == "mean" else int(args.channel)
        if channel is not None and not 0 <= channel < kernel.channels // kernel.heads:
            sys.exit(f"plot_kernels: a head of layer {args.layer} has {kernel.channels // kernel.heads} channels, "
                     f"asked for channel {channel}")
        curves[direction] = head_curves(kernel, args.length, args.output_channel, channel)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    plot(curves, heads, f"{args.checkpoint.name}: layer {args.layer}, stage {args.stage}", args.output)
    logger.info("wrote %s", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
