#!/usr/bin/env python
"""Long files offline with a bidirectional transducer: what the windows' seams cost, and memory against length.

    flock /tmp/cpu.lock python scripts/benchmarks/long_file_offline.py --checkpoint /work/models/mini/checkpoints/\
mssm_transducer/checkpoint_avg3.pt --corpus-root recipes/librispeech/mini/LibriSpeech

Recordings are made of consecutive utterances of a subset (default test-large, in manifest order: a chapter's
sentences in a row), joined with ``--pause-seconds`` of faint noise (a 16-bit recording's floor, so that no
filterbank frame is digital silence), one recording per chapter. Three tables:

* ``seams``: the encoder output of each recording's first ``--seam-seconds`` (short enough for whole-file
  encoding) window by window (``long_form.WindowedEncoder``) against whole-file encoding: the largest and the mean
  absolute difference over the frames, by window length, context and CMVN scope (``file``: the features equal the
  whole file's, so the difference is the encoder's alone; ``window``: each window's own utterance CMVN as well), and
  the same for the frames within 1 s of a seam.
* ``wer``: the WER of the whole recordings transcribed window by window (``long_form.transcribe_long``) against the
  same utterances transcribed one at a time (``Recognizer.transcribe``), by window length, context and CMVN scope,
  and cut at pauses of each of ``--wer-pauses`` seconds (``Windowing.pause_seconds``, ``pause_segments``: each
  piece decoded as an utterance), with the relative change (``--wer-windows`` with no value: no windowed rows).
* ``memory``: the process's peak resident memory (VmHWM) and the real-time factor of transcribing one recording
  repeated to each of ``--memory-minutes`` (a fresh interpreter each, default 1 and 60 minutes), with the default
  ``Windowing``.

Run alone: the real-time factors are times (``flock /tmp/cpu.lock``).
"""
from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import editdistance
import numpy as np
import soundfile as sf
import torch

from streaming_recognition import utterances
from ssm_fairseq.asr import Recognizer
from ssm_fairseq.asr.features.audio_features import SAMPLE_RATE
from ssm_fairseq.asr.features.audio_spans import AudioSpans
from ssm_fairseq.asr.long_form import WindowedEncoder, transcribe_long
from ssm_fairseq.asr.offline import transcribe_files
from ssm_fairseq.asr.windowing import FRAMES_PER_SECOND, Windowing

NOISE_FLOOR = 1 / 32768  # one 16-bit step: faint, never digital silence


def recordings(data_dir: Path, corpus_root: Path, subset: str, pause_seconds: float,
               out: Path) -> list[tuple[Path, list[Path], list[str]]]:
    """One recording per chapter of ``subset`` (its utterances in manifest order, each followed by a pause of
    noise), written under ``out``: ``(recording, the utterances' files, their reference transcripts)``."""
    rng = np.random.default_rng(0)
    made = []
    by_chapter = itertools.groupby(utterances(data_dir, corpus_root, subset), key=lambda item: item[0].parent.name)
    for chapter, items in by_chapter:
        items = list(items)
        pieces = []
        for path, _ in items:
            samples, rate = sf.read(path, dtype="float32")
            if rate != SAMPLE_RATE or samples.ndim != 1:
                sys.exit(f"{path}: 16 kHz mono expected")
            pieces += [samples, rng.normal(0, NOISE_FLOOR, int(pause_seconds * SAMPLE_RATE)).astype(np.float32)]
        recording = out / f"{subset}-{chapter}.wav"
        sf.write(recording, np.concatenate(pieces), SAMPLE_RATE, subtype="PCM_16")
        made.append((recording, [path for path, _ in items], [text for _, text in items]))
    return made


def word_errors(reference: str, hypothesis: str) -> int:
    return editdistance.eval(reference.split(), hypothesis.split())


def seams_table(recognizer: Recognizer, made: list, seconds: float, windows: list[float],
                contexts: list[float], out: Path) -> None:
    """Windowed against whole-file encoder outputs on each recording's first ``seconds``."""
    clips = []
    for recording, _, _ in made:
        clip = out / f"{recording.stem}-first{seconds:g}s.wav"
        samples, _ = sf.read(recording, dtype="float32", frames=int(seconds * SAMPLE_RATE))
        sf.write(clip, samples, SAMPLE_RATE, subtype="PCM_16")
        features = recognizer.features(clip).unsqueeze(0)
        with torch.no_grad():
            whole = recognizer.model.encoder(features, torch.tensor([features.shape[1]]))["encoder_out"][0]
        clips.append((clip, whole))
    scale = torch.cat([whole for _, whole in clips]).abs().mean().item()
    print(f"\nseams: encoder output of {len(clips)} clips of {seconds:g} s, windowed against whole-file "
          f"(mean |output| {scale:.3f})")
    print(f"{'window s':>8} {'context s':>9} {'cmvn':>6} {'windows':>7} {'max |diff|':>10} {'mean |diff|':>11} "
          f"{'max near seams':>14} {'mean near seams':>15}")
    for window, context, cmvn in itertools.product(windows, contexts, ("file", "window")):
        if window <= 2 * context:
            continue
        windowing = Windowing(window, context, cmvn)
        maxima, means, seam_maxima, seam_means, count = [], [], [], [], 0
        for clip, whole in clips:
            encoder = WindowedEncoder(recognizer, AudioSpans(clip), windowing)
            difference = (torch.cat(list(encoder), dim=1)[0] - whole).abs()
            stride = encoder.stride
            near = torch.zeros(whole.shape[0], dtype=torch.bool)  # encoder frames within 1 s of a seam
            for w in encoder.windows[1:]:
                seam, reach = w.centre_start // stride, FRAMES_PER_SECOND // stride
                near[max(0, seam - reach):seam + reach] = True
            maxima.append(difference.max().item())
            means.append(difference.mean().item())
            seam_maxima.append(difference[near].max().item())
            seam_means.append(difference[near].mean().item())
            count += len(encoder.windows)
        print(f"{window:>8g} {context:>9g} {cmvn:>6} {count:>7} {max(maxima):>10.4f} {np.mean(means):>11.5f} "
              f"{max(seam_maxima):>14.4f} {np.mean(seam_means):>15.5f}")


def wer_table(recognizer: Recognizer, made: list, windows: list[float], contexts: list[float],
              cmvns: list[str], pauses: list[float]) -> None:
    """WER of whole recordings, window by window and cut at pauses, against their utterances one at a time."""
    references = [" ".join(texts) for _, _, texts in made]
    words = sum(len(reference.split()) for reference in references)
    begin = time.perf_counter()
    one_by_one = [" ".join(recognizer.transcribe(files)) for _, files, _ in made]
    seconds = time.perf_counter() - begin
    baseline = 100 * sum(map(word_errors, references, one_by_one)) / words
    audio = sum(AudioSpans(recording).duration for recording, _, _ in made)
    print(f"\nwer: {len(made)} recordings, {audio / 60:.1f} min, {words} words; {recognizer.options.describe_search()}")
    print(f"{'decoded as':>36} {'WER %':>6} {'relative':>8} {'RTF':>6}")
    print(f"{'utterances one at a time':>36} {baseline:>6.2f} {'':>8} {seconds / audio:>6.3f}")
    ways = [(f"windows {window:g} s, context {context:g} s, {cmvn}", Windowing(window, context, cmvn))
            for window, context, cmvn in itertools.product(windows, contexts, cmvns) if window > 2 * context]
    ways += [(f"cut at pauses of {pause:g} s", Windowing(pause_seconds=pause)) for pause in pauses]
    for name, windowing in ways:
        begin = time.perf_counter()
        if windowing.pause_seconds:
            hypotheses = transcribe_files(recognizer, [recording for recording, _, _ in made], False, windowing)
        else:
            hypotheses = [transcribe_long(recognizer, recording, windowing) for recording, _, _ in made]
        seconds = time.perf_counter() - begin
        wer = 100 * sum(map(word_errors, references, hypotheses)) / words
        print(f"{name:>36} {wer:>6.2f} {f'{100 * (wer / baseline - 1):+.1f}%':>8} {seconds / audio:>6.3f}",
              flush=True)


def memory_child(checkpoint: Path, path: Path, beam: int) -> None:
    """In a fresh interpreter: transcribe ``path`` with the default windowing; print JSON with the peak RSS."""
    torch.set_num_threads(2)
    recognizer = Recognizer(checkpoint, device="cpu", beam=beam)
    loaded = _status_mib("VmHWM")
    begin = time.perf_counter()
    (text,) = recognizer.transcribe([path])
    seconds = time.perf_counter() - begin
    print(json.dumps({"loaded_mib": loaded, "peak_mib": _status_mib("VmHWM"), "seconds": seconds,
                      "words": len(text.split())}))


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_table(args: argparse.Namespace, recording: Path, out: Path) -> None:
    """Peak RSS of transcribing ``recording`` repeated to each of ``args.memory_minutes``, a process each."""
    samples, _ = sf.read(recording, dtype="float32")
    beam = args.memory_beam or args.beam
    print(f"\nmemory: {recording.name} repeated to each length, default Windowing {Windowing()}, beam {beam}, "
          "a fresh process each")
    print(f"{'minutes':>7} {'after loading MiB':>17} {'peak RSS MiB':>12} {'vs first':>8} {'words':>6} {'RTF':>6}")
    first = None
    for minutes in args.memory_minutes:
        path = out / f"repeated-{minutes:g}min.wav"
        with sf.SoundFile(path, "w", SAMPLE_RATE, 1, subtype="PCM_16") as file:  # written in pieces, not held
            remaining = int(minutes * 60 * SAMPLE_RATE)
            while remaining:
                file.write(samples[:remaining])
                remaining -= min(remaining, len(samples))
        result = subprocess.run([sys.executable, __file__, "--checkpoint", str(args.checkpoint), "--beam",
                                 str(beam), "--memory-child", str(path)], check=True, capture_output=True,
                                text=True)
        row = json.loads(result.stdout.strip().splitlines()[-1])
        first = first or row["peak_mib"]
        change = f"{100 * (row['peak_mib'] / first - 1):+.1f}%"
        print(f"{minutes:>7g} {row['loaded_mib']:>17.0f} {row['peak_mib']:>12.0f} {change:>8} {row['words']:>6} "
              f"{row['seconds'] / (minutes * 60):>6.3f}", flush=True)
        path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True, help="a bidirectional speech_transducer checkpoint")
    parser.add_argument("--corpus-root", type=Path, default=Path("recipes/librispeech/mini/LibriSpeech"))
    parser.add_argument("--subset", default="test-large")
    parser.add_argument("--pause-seconds", type=float, default=0.3, help="noise between utterances")
    parser.add_argument("--recordings", type=int, default=None, help="only the first N chapters' recordings")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--memory-beam", type=int, default=None, help="the memory table's beam (default --beam)")
    parser.add_argument("--tables", nargs="+", choices=("seams", "wer", "memory"), default=["seams", "wer", "memory"])
    parser.add_argument("--seam-seconds", type=float, default=60.0, help="clip length for the seams table")
    parser.add_argument("--seam-windows", type=float, nargs="+", default=[10.0, 30.0])
    parser.add_argument("--seam-contexts", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--wer-windows", type=float, nargs="*", default=[10.0, 30.0, 60.0],
                        help="the wer table's rows of whole recordings in windows of these seconds (none: none)")
    parser.add_argument("--wer-contexts", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--wer-cmvn", nargs="+", choices=("window", "file"), default=["window", "file"])
    parser.add_argument("--wer-pauses", type=float, nargs="*", default=[0.25, 0.5],
                        help="the wer table's rows cut at pauses of these seconds")
    parser.add_argument("--memory-minutes", type=float, nargs="+", default=[1.0, 60.0])
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/long_file_offline"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        return memory_child(args.checkpoint, args.memory_child, args.beam)
    torch.set_num_threads(args.threads)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    recognizer = Recognizer(args.checkpoint, device="cpu", beam=args.beam)
    data_dir = Path(recognizer.task.args.data)
    made = recordings(data_dir, args.corpus_root, args.subset, args.pause_seconds, args.work_dir)[:args.recordings]
    if "seams" in args.tables:
        seams_table(recognizer, made, args.seam_seconds, args.seam_windows, args.seam_contexts, args.work_dir)
    if "wer" in args.tables:
        wer_table(recognizer, made, args.wer_windows, args.wer_contexts, args.wer_cmvn, args.wer_pauses)
    if "memory" in args.tables:
        memory_table(args, made[0][0], args.work_dir)


if __name__ == "__main__":
    main()
