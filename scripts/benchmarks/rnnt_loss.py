#!/usr/bin/env python
"""Time and peak memory of the RNN-T loss: torchaudio's fused kernel against the pure-PyTorch backend.

Two workloads, forward + backward, at ``B x T x (U+1) x V`` (utterance b has ``T - b*T/(2B)`` frames and
``U - b*U/(2B)`` labels, so that sub-batches can trim their lattice):

* ``loss``: ``rnnt_loss`` on a given lattice of logits (the lattice itself is not counted in the memory);
* ``joiner + loss``: ``transducer_loss`` with a 512/512 -> 1024 tanh joiner from encoder and predictor
  outputs, the whole batch at once (sub-batch 0) and one utterance at a time (sub-batch 1);
* ``joiner + pruned loss``: ``pruned_transducer_loss`` (simple loss with its trivial joiner, pruning bounds, the
  same joiner on ``--prune-range`` label positions per frame), in a second table against the whole-batch full
  lattice of both backends.

Time is the best of ``--repeats`` runs after one warm-up; peak memory is measured above the baseline before
the run (``measurement.py``: ``torch.cuda.max_memory_allocated`` on a GPU, peak RSS of a fresh subprocess on
CPU).
"""
from __future__ import annotations

import argparse
import json
from typing import Callable

import torch
from measurement import add_measurement_arguments, in_subprocess, measure

from ssm_fairseq.asr.transducer.joiner import Joiner
from ssm_fairseq.asr.transducer.pruned_rnnt_loss import SimpleJoiner, pruned_transducer_loss
from ssm_fairseq.asr.transducer.rnnt_loss import rnnt_loss, torchaudio_rnnt_available, transducer_loss

ENCODER_DIM, PREDICTOR_DIM, JOINT_DIM = 512, 512, 1024
WORKLOADS = {"loss": None, "joiner + loss, sub-batch 0": 0, "joiner + loss, sub-batch 1": 1}
PRUNED = "joiner + pruned loss"


def build(workload: str, backend: str, B: int, T: int, U: int, V: int, device: str,
          prune_range: int = 5) -> Callable[[], None]:
    """One forward + backward of the workload; gradients are released at the end of each call."""
    torch.manual_seed(0)
    shrink = torch.arange(B) / (2 * B)
    logit_lengths, target_lengths = (T * (1 - shrink)).long(), (U * (1 - shrink)).long()
    targets = torch.randint(1, V, (B, U), device=device)
    sub_batch_size = WORKLOADS.get(workload)
    if workload == "loss":
        logits = torch.randn(B, T, U + 1, V, device=device, requires_grad=True)

        def run():
            rnnt_loss(logits, targets, logit_lengths, target_lengths, blank=0, backend=backend).sum().backward()
            logits.grad = None
        return run

    joiner = Joiner(ENCODER_DIM, PREDICTOR_DIM, JOINT_DIM, V, "tanh").to(device)
    encoder_out = torch.randn(B, T, ENCODER_DIM, device=device, requires_grad=True)
    predictor_out = torch.randn(B, U + 1, PREDICTOR_DIM, device=device, requires_grad=True)

    simple_joiner = SimpleJoiner(ENCODER_DIM, PREDICTOR_DIM, V).to(device)

    def run():
        if workload == PRUNED:
            losses, _ = pruned_transducer_loss(joiner, simple_joiner, encoder_out, predictor_out, targets,
                                               logit_lengths, target_lengths, blank=0, prune_range=prune_range)
        else:
            losses, _ = transducer_loss(joiner, encoder_out, predictor_out, targets, logit_lengths, target_lengths,
                                        blank=0, backend=backend, sub_batch_size=sub_batch_size)
        losses.sum().backward()
        joiner.zero_grad(set_to_none=True)
        simple_joiner.zero_grad(set_to_none=True)
        encoder_out.grad = predictor_out.grad = None
    return run


def measure_workload(args: argparse.Namespace) -> dict:
    workload, backend = args.one
    run = build(workload, backend, args.batch, args.frames, args.labels, args.vocab[0], args.device,
                args.prune_range)
    return measure(run, args.device, args.repeats, args.what)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--labels", type=int, default=40)
    parser.add_argument("--vocab", type=int, nargs="+", default=[500, 4097])
    parser.add_argument("--prune-range", type=int, default=5)
    parser.add_argument("--tables", nargs="+", choices=("backends", "pruned"), default=["backends", "pruned"])
    add_measurement_arguments(parser, repeats=3)
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "BACKEND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(measure_workload(args)))
        return

    backends = ["torchaudio", "pytorch"] if torchaudio_rnnt_available() else ["pytorch"]
    B, T, U = args.batch, args.frames, args.labels
    common = ["--batch", str(B), "--frames", str(T), "--labels", str(U), "--device", args.device,
              "--repeats", str(args.repeats), "--threads", str(args.threads)]
    if "backends" in args.tables:
        backends_table(args, backends, common)
    if "pruned" in args.tables:
        pruned_table(args, backends, common)


def backends_table(args: argparse.Namespace, backends: list[str], common: list[str]) -> None:
    """Each workload with torchaudio's and our backend."""
    B, T, U = args.batch, args.frames, args.labels
    print(f"# RNN-T loss, torchaudio vs pure PyTorch: B={B}, T={T}, U={U}, forward+backward, device {args.device}, "
          f"{args.threads} threads, best of {args.repeats}, torch {torch.__version__}\n")
    print("| V | lattice MiB | workload | torchaudio ms | pytorch ms | torchaudio MiB | pytorch MiB "
          "| pytorch/torchaudio time | pytorch/torchaudio mem |")
    print("|---|---|---|---|---|---|---|---|---|")
    for V in args.vocab:
        lattice_mib = B * T * (U + 1) * V * 4 / 2**20
        for workload in WORKLOADS:
            r = {backend: in_subprocess(__file__, ["--one", workload, backend, "--vocab", str(V), *common])
                 for backend in backends}
            pt, ta = r["pytorch"], r.get("torchaudio")
            if ta is None:
                cells = ["n/a", f"{1e3 * pt['seconds']:.0f}", "n/a", f"{pt['peak_mib']:.0f}", "n/a", "n/a"]
            else:
                cells = [f"{1e3 * ta['seconds']:.0f}", f"{1e3 * pt['seconds']:.0f}", f"{ta['peak_mib']:.0f}",
                         f"{pt['peak_mib']:.0f}", f"{pt['seconds'] / ta['seconds']:.2f}x",
                         f"{pt['peak_mib'] / max(ta['peak_mib'], 1e-9):.2f}x"]
            print(f"| {V} | {lattice_mib:.0f} | {workload} | " + " | ".join(cells) + " |", flush=True)
    if len(backends) == 1:
        print("\ntorchaudio.functional.rnnt_loss does not import here: pytorch backend only.")


def pruned_table(args: argparse.Namespace, backends: list[str], common: list[str]) -> None:
    """The pruned loss against the whole-batch full lattice of each backend, same run."""
    full = "joiner + loss, sub-batch 0"
    print(f"\n# Pruned RNN-T (S = {args.prune_range}) against the whole-batch full lattice: B={args.batch}, "
          f"T={args.frames}, U={args.labels}, forward+backward, {args.threads} threads, best of {args.repeats}\n")
    print("| V | workload | ms | peak MiB | full/pruned time | full/pruned memory |")
    print("|---|---|---|---|---|---|")
    for V in args.vocab:
        pruned = in_subprocess(__file__, ["--one", PRUNED, "pytorch", "--vocab", str(V),
                                          "--prune-range", str(args.prune_range), *common])
        print(f"| {V} | {PRUNED} | {1e3 * pruned['seconds']:.0f} | {pruned['peak_mib']:.0f} | 1.00x | 1.00x |")
        for backend in backends:
            r = in_subprocess(__file__, ["--one", full, backend, "--vocab", str(V), *common])
            print(f"| {V} | {full}, {backend} | {1e3 * r['seconds']:.0f} | {r['peak_mib']:.0f} "
                  f"| {r['seconds'] / pruned['seconds']:.2f}x | {r['peak_mib'] / max(pruned['peak_mib'], 1e-9):.2f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
