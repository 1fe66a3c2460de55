#!/usr/bin/env python
"""A streaming transducer on ONNX Runtime against PyTorch: time per encoder chunk, WER, real-time factor, peak memory.

    flock /tmp/cpu.lock python scripts/benchmarks/onnx_runtime.py --checkpoint \
/work/models/mini_streaming/checkpoints/mssm_transducer_streaming/checkpoint_avg5.pt \
--corpus-root recipes/librispeech/mini/LibriSpeech --subset test-large

The checkpoint is exported (``ssm_fairseq.deploy.exporter``: fp32 and int8, ``--chunk-frames`` feature frames per
encoder call) to a temporary directory, unless ``--onnx DIR`` gives an export (an ``--offline`` one for a
bidirectional checkpoint: then there is no chunk step to time, and no ``pytorch streamed``). Each decoder runs in its
own child process, so that its peak memory (resident set, imports and model included) is its own:

* ``pytorch offline``: ``asr.Recognizer.transcribe`` (what ``ssm-transcribe --checkpoint`` runs: the whole file
  through the encoder's ``forward``, batched as fairseq-generate batches);
* ``pytorch streamed``: ``Recognizer.stream().stream_file`` in ``--chunk-ms`` chunks (the encoder's ``step``);
* ``onnx fp32`` / ``onnx int8``: ``deploy.recognizer.OnnxRecognizer.transcribe`` (torch is not imported in these
  children): each file one stream through the exported chunk step.

Columns: the encoder's time per chunk of ``--chunk-frames`` frames (median and 95th percentile over
``--chunk-repeats`` chunks of one stream, after 10 of warm-up; PyTorch's ``SpeechEncoder.step``, ONNX's
``encode_chunk``), the WER of ``--subset`` (words as fairseq-generate's scorer counts them), how many transcripts
differ from ``pytorch offline``'s, the real-time factor (compute seconds per second of audio, from reading the files
to the text), the peak resident memory of the child, and the size on disk of what each loads. ``--what wer`` leaves
out the timings, chunk and real-time factor (for a busy machine: the WER and the differences do not depend on it). Timings are only
comparable when the machine is quiet: run under ``flock /tmp/cpu.lock``. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DECODERS = ("pytorch offline", "pytorch streamed", "onnx fp32", "onnx int8")


def _timing(step, repeats: int) -> tuple[float, float]:
    """(median, 95th percentile) milliseconds of ``step()`` over ``repeats`` calls after 10 of warm-up."""
    for _ in range(10):
        step()
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        step()
        times.append(1000 * (time.perf_counter() - begin))
    return float(np.median(times)), float(np.percentile(times, 95))


def run_pytorch(args: argparse.Namespace, paths: list[str], streamed: bool) -> dict:
    import torch

    from ssm_fairseq.asr import Recognizer

    torch.set_num_threads(args.threads)
    recognizer = Recognizer(args.checkpoint, data_dir=args.data_dir, device="cpu", beam=args.beam)
    result = {}
    if args.what == "all" and not streamed and recognizer.streaming_problem() is None:  # a causal model's step
        cache: dict = {}
        chunk = torch.randn(1, args.chunk_frames, 80, generator=torch.Generator().manual_seed(0))

        @torch.no_grad()
        def step():
            recognizer.model.encoder.step(chunk, cache)
        result["chunk_ms"] = _timing(step, args.chunk_repeats)
    begin = time.perf_counter()
    if streamed:
        stream = recognizer.stream()
        texts = [stream.stream_file(path, args.chunk_ms).text for path in paths]
    else:
        texts = recognizer.transcribe(paths)
    result.update(seconds=time.perf_counter() - begin, texts=texts)
    return result


def run_onnx(args: argparse.Namespace, paths: list[str], precision: str) -> dict:
    from ssm_fairseq.deploy.recognizer import OnnxRecognizer

    recognizer = OnnxRecognizer(args.onnx, precision, beam=args.beam, threads=args.threads)
    result = {}
    if args.what == "all" and not recognizer.model.offline:  # an --offline export has no chunk step
        model = recognizer.model
        features = np.random.default_rng(0).standard_normal((model.chunk_frames, 80)).astype(np.float32)
        states = [model.initial_states()]

        def step():
            states[0] = model.encode_chunk(features, states[0])[2]
        result["chunk_ms"] = _timing(step, args.chunk_repeats)
    begin = time.perf_counter()
    texts = recognizer.transcribe(paths)
    result.update(seconds=time.perf_counter() - begin, texts=texts)
    assert not any(name.split(".")[0] == "torch" for name in sys.modules), "torch was imported"
    return result


def child(args: argparse.Namespace) -> None:
    paths = json.loads(Path(args.paths_file).read_text())
    if args.child.startswith("pytorch"):
        result = run_pytorch(args, paths, args.child == "pytorch streamed")
    else:
        result = run_onnx(args, paths, args.child.split()[1])
    result["peak_mib"] = peak_resident_mib()
    print(json.dumps(result))


def peak_resident_mib() -> float:
    """This process's peak resident memory (``VmHWM``: its own address space's, where ``ru_maxrss`` would carry the
    parent's from before the ``exec``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def directory_mib(directory: Path, pattern: str) -> float:
    return sum(p.stat().st_size for p in directory.glob(pattern)) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True, help="a causal (streaming) transducer checkpoint")
    parser.add_argument("--data-dir", type=Path, default=None, help="its data directory (default: the checkpoint's)")
    parser.add_argument("--onnx", type=Path, default=None, help="its export with --int8 (default: exported here)")
    parser.add_argument("--corpus-root", type=Path, default=Path("recipes/librispeech/mini/LibriSpeech"))
    parser.add_argument("--subset", default="test-large")
    parser.add_argument("--limit", type=int, default=None, help="the first N utterances only")
    parser.add_argument("--beam", type=int, default=4, help="1: greedy search (default 4, as the recipe)")
    parser.add_argument("--chunk-frames", type=int, default=32, help="feature frames per encoder call (default 32)")
    parser.add_argument("--chunk-ms", type=float, default=320, help="pytorch streamed: audio per chunk (default 320)")
    parser.add_argument("--chunk-repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--what", choices=("all", "wer"), default="all", help="wer: no chunk timing")
    parser.add_argument("--decoders", nargs="+", choices=DECODERS, default=list(DECODERS),
                        help="which to run (default all; pytorch offline always, the baseline)")
    parser.add_argument("--child", choices=DECODERS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--paths-file", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    from decoding import word_error_rate  # torch and fairseq: the parent's, not the ONNX children's
    from streaming_recognition import utterances

    with tempfile.TemporaryDirectory() as tmp:
        if args.onnx is None:
            from ssm_fairseq.deploy.exporter import export_checkpoint

            args.onnx = export_checkpoint(args.checkpoint, Path(tmp) / "exported", args.data_dir, args.chunk_frames,
                                          int8=True)
        data_dir = args.data_dir or _checkpoint_data_dir(args.checkpoint)
        items = utterances(data_dir, args.corpus_root, args.subset)[:args.limit]
        references = [text for _, text in items]
        paths_file = Path(tmp) / "paths.json"
        paths_file.write_text(json.dumps([str(path) for path, _ in items]))
        import soundfile as sf

        audio_seconds = sum(sf.info(str(path)).duration for path, _ in items)
        results = {}
        for decoder in sorted(set(args.decoders) | {"pytorch offline"}, key=DECODERS.index):
            command = [sys.executable, __file__, "--checkpoint", str(args.checkpoint), "--onnx", str(args.onnx),
                       "--beam", str(args.beam), "--chunk-frames", str(args.chunk_frames), "--chunk-ms",
                       str(args.chunk_ms), "--chunk-repeats", str(args.chunk_repeats), "--threads", str(args.threads),
                       "--what", args.what, "--child", decoder, "--paths-file", str(paths_file)]
            if args.data_dir:
                command += ["--data-dir", str(args.data_dir)]
            run = subprocess.run(command, capture_output=True, text=True)
            if run.returncode:
                sys.exit(f"{decoder} failed:\n{run.stderr[-3000:]}")
            results[decoder] = json.loads(run.stdout.splitlines()[-1])
        sizes = {"pytorch offline": args.checkpoint.stat().st_size / 2**20,
                 "pytorch streamed": args.checkpoint.stat().st_size / 2**20,
                 "onnx fp32": directory_mib(args.onnx, "*[a-z].onnx"),  # encoder.onnx, ...: not *.int8.onnx
                 "onnx int8": directory_mib(args.onnx, "*.int8.onnx")}
    report(args, results, references, audio_seconds, sizes, word_error_rate)


def report(args, results: dict, references: list[str], audio_seconds: float, sizes: dict, word_error_rate) -> None:
    """The table."""
    print(f"# {args.checkpoint}, {args.subset}: {len(references)} utterances, {audio_seconds / 60:.1f} min of audio; "
          f"beam {args.beam}, {args.threads} threads, {args.chunk_frames}-frame chunks\n")
    print("| decoder | chunk ms: median / p95 | WER % | differing from pytorch offline | real-time factor "
          "| peak MiB | on disk MiB |")
    print("|---|---|---|---|---|---|---|")
    baseline = results["pytorch offline"]["texts"]
    for decoder, r in results.items():
        chunk = "/".join(f"{t:.2f}" for t in r["chunk_ms"]) if "chunk_ms" in r else ""
        differing = sum(a != b for a, b in zip(r["texts"], baseline))
        rtf = f"{r['seconds'] / audio_seconds:.4f}" if args.what == "all" else ""  # a timing: quiet machine only
        print(f"| {decoder} | {chunk} | {word_error_rate(list(zip(references, r['texts']))):.2f} | "
              f"{differing} of {len(baseline)} | {rtf} | {r['peak_mib']:.0f} | "
              f"{sizes[decoder]:.2f} |")


def _checkpoint_data_dir(checkpoint: Path) -> Path:
    """The data directory a checkpoint was trained on (its task's ``data``)."""
    from ssm_fairseq.asr.checkpoint import load_checkpoint

    return Path(load_checkpoint(checkpoint)["cfg"].task.data)


if __name__ == "__main__":
    main()
