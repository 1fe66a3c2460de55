#!/usr/bin/env python
"""Training throughput and peak memory of speech encoders at equal width and depth.

Each encoder (``mssm``, ``stateformer``, ``transformer``, ``conformer``; ``--encoders`` adds ``s4``) is built
from the same ``LayerConfig`` (width 512, FFN 2048, 8 attention heads, 4 MSSM heads with inter-head gating,
stack 2, ``D_sh`` 32) and the same sub-sampler, so the layers are what differs. Training: one forward+backward
of a batch of utterances of 10 s and 30 s (100 filterbank frames per second); inference: one forward in eval
mode without autograd, what decoding pays (SSM kernels are then generated once and reused). Throughput is input
frames per second. Ratios are against the transformer encoder of the same run. Time and peak memory are measured
as ``measurement.py`` describes (peak memory of training).

``--architectures mssm_transducer transformer_transducer`` measures instead the encoders of registered transducer
architectures as built for training (their own depth, heads and sub-sampler; the paper's Table 2 compares them at
equal parameters: 16 MSSM layers against 20 transformer layers).

``--max-tokens N`` measures batches as fairseq-train forms them under ``--max-tokens N`` (the LibriSpeech recipe's
is 40000): utterances sorted by length, as many per batch as fit ``N`` padded frames (batch size times its longest
utterance). Each of ``--mix`` (utterance seconds) gives one batch of utterances spread evenly from 90% to 100% of
that length (its padding is what a batch of neighbours in the sorted corpus has); throughput is utterance-seconds
(real audio, padding excluded) per second of training and of inference, each batch and the whole mix (its
utterance-seconds over its summed time). ``--batch-one`` adds, for each length of the mix, one utterance alone.

``--compiled`` measures each encoder twice: eager and with its layers compiled (``ssm_fairseq/layers/compiled.py``,
what ``--compile-encoder`` builds), each in its own interpreter; the first call's extra time (compilation) is
reported beside it, per mode (training, inference), for that interpreter (inductor's on-disk cache of generated
code, shared by later runs, makes a second compilation of the same graphs faster).
"""
from __future__ import annotations

import argparse
import json

import torch

from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

from measurement import add_measurement_arguments, child, in_subprocess, measure
from ssm_fairseq.asr.transducer.model import TransducerConfig, TransducerModel
from ssm_fairseq.layers.compiled import compile_layers
from ssm_fairseq.layers.encoder_layer import LayerConfig
from ssm_fairseq.asr.encoder.speech_encoder import SpeechEncoder

FRAMES_PER_SECOND = 100
# the shortest utterance of a --mix batch, as a share of its longest
BATCH_SPREAD = 0.9


def architecture_encoder(architecture: str, frames: int) -> SpeechEncoder:
    """The encoder of a registered transducer architecture (its defaults, ``max_source_positions = frames``)."""
    options = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[architecture](options)
    cfg = TransducerConfig(**vars(options))
    cfg.max_source_positions = frames
    return TransducerModel.build_encoder(cfg)


def mix_batch_frames(seconds: float, max_tokens: int) -> list[int]:
    """The utterance lengths (feature frames, longest first) of one batch of ``--max-tokens`` around ``seconds``:
    as many utterances as fit ``max_tokens`` padded frames, spread evenly from ``BATCH_SPREAD`` of the longest up."""
    longest = round(seconds * FRAMES_PER_SECOND)
    count = max_tokens // longest
    if count < 1:
        raise ValueError(f"an utterance of {seconds} s ({longest} frames) does not fit --max-tokens {max_tokens}")
    shortest = BATCH_SPREAD * longest
    return [round(longest - (longest - shortest) * i / max(count - 1, 1)) for i in range(count)]


def padded_features(frames: list[int], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of random 80-bin filterbank features, utterance ``i`` ``frames[i]`` long and zero after it:
    ``B x max(frames) x 80`` and the lengths ``B``."""
    lengths = torch.tensor(frames, device=device)
    features = torch.randn(len(frames), max(frames), 80, device=device)
    features[torch.arange(max(frames), device=device) >= lengths[:, None]] = 0
    return features, lengths


def unknown_architectures(names: list[str]) -> list[str]:
    """Those of ``names`` that are not registered transducer architectures."""
    return [name for name in names if ARCH_MODEL_REGISTRY.get(name) is not TransducerModel]


def encoder_step(args: argparse.Namespace):
    """One training step or inference (``args.mode``) of one encoder on one batch, as a function of no arguments:
    ``args.frames`` (utterance lengths, in feature frames) or ``args.batch`` utterances of ``args.seconds``."""
    torch.manual_seed(0)
    frames = getattr(args, "frames", None) or [args.seconds * FRAMES_PER_SECOND] * args.batch
    longest = max(frames)
    if args.architecture:
        encoder = architecture_encoder(args.architecture, longest).to(args.device)
    else:
        cfg = LayerConfig(dim=args.width, ffn_dim=4 * args.width, dropout=0.1, s4_l_max=longest // 4 + 1)
        encoder = SpeechEncoder(args.encoder, args.layers, cfg, subsampler=args.subsampler,
                                positions=args.encoder in ("transformer", "conformer")).to(args.device)
    if getattr(args, "compiled", False):
        compile_layers(encoder.layers, backend=getattr(args, "compile_backend", "inductor"))
    features, lengths = padded_features(frames, args.device)

    def train():
        encoder.zero_grad(set_to_none=True)
        encoder(features, lengths)["encoder_out"].square().mean().backward()

    @torch.no_grad()
    def infer():
        encoder(features, lengths)

    encoder.train(args.mode == "train")
    return train if args.mode == "train" else infer


def measure_encoder(args: argparse.Namespace) -> dict:
    """Time or memory (``args.what``) of ``encoder_step(args)``."""
    return measure(encoder_step(args), args.device, args.repeats, args.what)


def encoder_results(which: str, names: list[str], frames: list[int], path: str, common: list[str]) -> dict[str, dict]:
    """Each encoder's training time and peak memory and inference time on one batch (``frames``), in fresh
    interpreters: ``{name: {"train": ..., "eval": ...}}``."""
    batch = ["--frames", *map(str, frames), "--path", path, *common]
    return {name: {"train": in_subprocess(__file__, [which, name, *batch]),
                   "eval": child(__file__, ["--what", "time", "--mode", "eval", which, name, *batch])}
            for name in names}


def print_batches_table(args: argparse.Namespace, which: str, names: list[str], reference_name: str) -> None:
    """The ``--max-tokens`` table (module docstring): a row per batch, path and encoder, then the whole mix."""
    kinds = {f"--max-tokens {args.max_tokens}": lambda seconds: mix_batch_frames(seconds, args.max_tokens)}
    if args.batch_one:
        kinds["one utterance"] = lambda seconds: [round(seconds * FRAMES_PER_SECOND)]
    batches = [(kind, seconds, frames(seconds)) for kind, frames in kinds.items() for seconds in args.mix]
    paths = ["eager", "compiled"] if args.compiled else ["eager"]
    common = ["--layers", str(args.layers), "--width", str(args.width), "--subsampler", args.subsampler,
              "--device", args.device, "--repeats", str(args.repeats), "--threads", str(args.threads)]
    print(f"| encoder | path | batch | utterances | training utterance-s/s | peak MiB | training vs {reference_name} "
          f"| inference utterance-s/s | inference vs {reference_name} | first call: training / inference s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    totals = {}  # (kind of batch, path, encoder) -> [utterance seconds, training s, inference s, peak MiB]
    for kind, seconds, frames in batches:
        audio = sum(frames) / FRAMES_PER_SECOND
        for path in paths:
            results = encoder_results(which, names, frames, path, common)
            reference = results.get(reference_name)
            for name, r in results.items():
                train, infer = r["train"], r["eval"]
                total = totals.setdefault((kind, path, name), [0.0, 0.0, 0.0, 0.0])
                total[:3] = [total[0] + audio, total[1] + train["seconds"], total[2] + infer["seconds"]]
                total[3] = max(total[3], train["peak_mib"])
                train_ratio = f"{reference['train']['seconds'] / train['seconds']:.2f}x" if reference else "-"
                eval_ratio = f"{reference['eval']['seconds'] / infer['seconds']:.2f}x" if reference else "-"
                first = (f"{train['first_seconds']:.1f} / {infer['first_seconds']:.1f}")
                print(f"| {name} | {path} | {seconds:g} s, {kind} | {len(frames)} | {audio / train['seconds']:.1f} "
                      f"| {train['peak_mib']:.0f} | {train_ratio} | {audio / infer['seconds']:.1f} | {eval_ratio} "
                      f"| {first} |", flush=True)
    for (kind, path, name), (audio, train_s, eval_s, peak) in totals.items():
        reference = totals.get((kind, path, reference_name))
        train_ratio = f"{reference[1] / train_s:.2f}x" if reference else "-"
        eval_ratio = f"{reference[2] / eval_s:.2f}x" if reference else "-"
        print(f"| {name} | {path} | the mix, {kind} | - | {audio / train_s:.1f} | {peak:.0f} | {train_ratio} "
              f"| {audio / eval_s:.1f} | {eval_ratio} | - |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoders", nargs="+", default=["mssm", "stateformer", "transformer", "conformer"])
    parser.add_argument("--architectures", nargs="+", metavar="ARCH",
                        help="registered transducer architectures whose encoders to compare instead (the last is "
                             "the reference of the ratios)")
    parser.add_argument("--durations", type=int, nargs="+", default=[10, 30], help="utterance seconds")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--subsampler", default="tr", choices=["conv", "tr", "ms"])
    parser.add_argument("--max-tokens", type=int,
                        help="measure batches as fairseq-train forms them under this --max-tokens (feature frames; "
                             "the LibriSpeech recipe's: 40000), one per --mix length, in utterance-seconds per second")
    parser.add_argument("--mix", type=float, nargs="+", default=[15.0],
                        help="with --max-tokens: the longest utterance of each batch, in seconds")
    parser.add_argument("--batch-one", action="store_true", help="with --max-tokens: also each --mix length alone")
    parser.add_argument("--compiled", action="store_true",
                        help="with --max-tokens: each encoder eager and with its layers compiled (--compile-encoder)")
    add_measurement_arguments(parser, repeats=2)
    parser.add_argument("--encoder", help=argparse.SUPPRESS)
    parser.add_argument("--architecture", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--frames", type=int, nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--path", choices=("eager", "compiled"), default="eager", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("train", "eval"), default="train", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.encoder or args.architecture:
        args.compiled = args.path == "compiled"
        print(json.dumps(measure_encoder(args)))
        return
    if (args.compiled or args.batch_one) and not args.max_tokens:
        parser.error("--compiled and --batch-one measure --max-tokens batches: give --max-tokens")

    if args.architectures:
        unknown = unknown_architectures(args.architectures)
        if unknown:
            parser.error(f"not registered transducer architectures: {unknown}")
        encoders, reference_name, which = args.architectures, args.architectures[-1], "--architecture"
        shape = "the architectures' own depth, width and sub-sampler"
    else:
        encoders, reference_name, which = args.encoders, "transformer", "--encoder"
        shape = f"{args.layers} layers, width {args.width}, sub-sampler {args.subsampler}"
    batch = f"--max-tokens {args.max_tokens} batches" if args.max_tokens else f"batch {args.batch}"
    print(f"# Encoders, forward+backward: {shape}, {batch}, device {args.device}, {args.threads} "
          f"threads, torch {torch.__version__}\n")
    if args.max_tokens:
        print_batches_table(args, which, encoders, reference_name)
        return
    print(f"| encoder | utterance | training frames/s | peak MiB | training frames/s vs {reference_name} "
          f"| memory vs {reference_name} | inference frames/s | inference vs {reference_name} |")
    print("|---|---|---|---|---|---|---|---|")
    for seconds in args.durations:
        common = ["--layers", str(args.layers), "--width", str(args.width), "--batch", str(args.batch),
                  "--subsampler", args.subsampler, "--device", args.device, "--repeats", str(args.repeats),
                  "--threads", str(args.threads), "--seconds", str(seconds)]
        rows = {name: in_subprocess(__file__, [which, name, *common]) for name in encoders}
        inference = {name: child(__file__, ["--what", "time", "--mode", "eval", which, name, *common])
                     for name in encoders}
        reference, reference_inference = rows.get(reference_name), inference.get(reference_name)
        for name, r in rows.items():
            fps = args.batch * seconds * FRAMES_PER_SECOND / r["seconds"]
            eval_fps = args.batch * seconds * FRAMES_PER_SECOND / inference[name]["seconds"]
            ratios = "| - | - |"
            if reference:
                ratios = (f"| {reference['seconds'] / r['seconds']:.2f}x "
                          f"| {r['peak_mib'] / max(reference['peak_mib'], 1e-9):.2f}x |")
            eval_ratio = f"{reference_inference['seconds'] / inference[name]['seconds']:.2f}x" if reference else "-"
            print(f"| {name} | {seconds} s | {fps:.0f} | {r['peak_mib']:.0f} {ratios} {eval_fps:.0f} | {eval_ratio} |",
                  flush=True)


if __name__ == "__main__":
    main()
