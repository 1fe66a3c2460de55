#!/usr/bin/env python
"""WER of one transducer checkpoint under several CMVN settings, on subsets of a LibriSpeech-layout corpus.

    python scripts/benchmarks/cmvn_wer.py --checkpoint /work/models/mini_streaming/checkpoints/\
mssm_transducer_streaming/checkpoint_avg3.pt --corpus-root recipes/librispeech/mini/LibriSpeech \
--subsets test-large test-unheard --cmvn config global adapt:100 adapt:300 adapt:1000

Settings (``--cmvn``): ``config`` (the data directory's own CMVN, as the model trained), ``utterance`` (each
utterance's own mean and std: fairseq's ``UtteranceCMVN``), ``global`` (the training set's statistics: the config's,
or ``--cmvn-stats``), ``adapt:N`` (streaming-adaptive CMVN after global CMVN, a prior of ``N`` frames:
``ssm_fairseq.asr.features.adaptive_cmvn``). ``global`` and ``adapt:N`` are built by
``features.transforms.decoding_transforms``, the function behind ``DecodingOptions.cmvn_stats`` /
``cmvn_adapt_frames`` (``ssm-transcribe --cmvn-stats / --cmvn-adapt``). The model loads once; each setting swaps the
recognizer's feature transforms and decodes every subset offline (``Recognizer.transcribe``, the search of
``--beam``). WER is word errors over reference words (transcripts upper-cased), per subset and, for the subsets of
``--by-speaker``, per speaker; a second table gives each setting's WER change against the first setting's, per
subset, with a 95% interval from a paired bootstrap over utterances (how far one run's difference can be from
chance on these utterances; it says nothing of the spread between training seeds). Adaptive CMVN offline equals adaptive CMVN streamed (tests/test_adaptive_cmvn.py), so
the offline WER is the streamed one's up to the encoder's float32 rounding. One checkpoint: one training seed.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import editdistance
import numpy as np
import torch
from fairseq.data.audio.feature_transforms import CompositeAudioFeatureTransform
from fairseq.data.audio.feature_transforms.utterance_cmvn import UtteranceCMVN

from ssm_fairseq.asr import Recognizer
from ssm_fairseq.asr.features.transforms import decoding_transforms


def corpus_subset(root: Path, subset: str) -> list[tuple[str, Path, str]]:
    """``(utterance id, flac, transcript)`` of every utterance of ``root/subset``, sorted by id."""
    rows = []
    for trans in sorted((root / subset).glob("*/*/*.trans.txt")):
        for line in trans.read_text().splitlines():
            utterance, text = line.split(" ", 1)
            rows.append((utterance, trans.parent / f"{utterance}.flac", text))
    if not rows:
        raise SystemExit(f"{root / subset}: no utterances (LibriSpeech layout: SPEAKER/CHAPTER/*.trans.txt)")
    return sorted(rows)


def transforms_for(setting: str, config: CompositeAudioFeatureTransform | None, stats: Path | None):
    """The feature transforms of one ``--cmvn`` setting (see the module's docstring)."""
    if setting == "config":
        return config
    if setting == "utterance":
        return CompositeAudioFeatureTransform([UtteranceCMVN()])
    if setting == "global":
        return decoding_transforms(config, cmvn_stats=stats, cmvn_adapt_frames=float("inf"))
    if setting.startswith("adapt:"):
        return decoding_transforms(config, cmvn_stats=stats, cmvn_adapt_frames=float(setting.split(":", 1)[1]))
    raise SystemExit(f"--cmvn {setting}: expected config, utterance, global or adapt:FRAMES")


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word edit distance, reference words)."""
    words = reference.upper().split()
    return editdistance.eval(words, hypothesis.upper().split()), len(words)


def paired_interval(first: np.ndarray, second: np.ndarray, resamples: int = 2000) -> tuple[float, float, float]:
    """WER change (points) from ``first`` to ``second`` (``utterances x 2``: word errors, reference words; the same
    utterances in the same order) and its 95% interval by a paired bootstrap over utterances."""
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(first), (resamples, len(first)))
    words = first[picks, 1].sum(axis=1)
    changes = 100 * (second[picks, 0].sum(axis=1) - first[picks, 0].sum(axis=1)) / words
    change = 100 * (second[:, 0].sum() - first[:, 0].sum()) / first[:, 1].sum()
    return change, *np.percentile(changes, [2.5, 97.5])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data-dir", default=None, help="the checkpoint's data directory if it moved")
    parser.add_argument("--corpus-root", type=Path, default=Path("recipes/librispeech/mini/LibriSpeech"))
    parser.add_argument("--subsets", nargs="+", default=["test-large", "test-unheard"])
    parser.add_argument("--by-speaker", nargs="*", default=["test-unheard"],
                        help="subsets whose WER is also given per speaker")
    parser.add_argument("--cmvn", nargs="+", default=["config", "global", "adapt:100", "adapt:300", "adapt:1000"])
    parser.add_argument("--cmvn-stats", type=Path, default=None,
                        help="global statistics (gcmvn.npz) for global and adapt:N, when the config has none")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--label", default=None, help="the table's model column (default: the checkpoint's name)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    recognizer = Recognizer(args.checkpoint, data_dir=args.data_dir, device="cpu", beam=args.beam)
    config = recognizer.feature_transforms
    subsets = {subset: corpus_subset(args.corpus_root, subset) for subset in args.subsets}
    columns = [(subset, None) for subset in args.subsets]
    for subset in args.by_speaker:
        if subset in subsets:
            columns += [(subset, speaker) for speaker in sorted({u.split("-")[0] for u, _, _ in subsets[subset]})]
    label = args.label or Path(args.checkpoint).parent.name
    print(f"{label}: {recognizer.options.describe_search()}, config CMVN {config}; "
          + ", ".join(f"{s} {len(rows)} utterances" for s, rows in subsets.items()), file=sys.stderr)
    header = ["model", "CMVN"] + [f"{s} WER %" if spk is None else f"{s} spk {spk}" for s, spk in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    print(lines[0], lines[1], sep="\n", flush=True)
    per_utterance: dict[str, dict[str, np.ndarray]] = {}  # setting -> subset -> utterances x (errors, words)
    for setting in args.cmvn:
        recognizer.feature_transforms = transforms_for(setting, config, args.cmvn_stats)
        errors: dict[tuple[str, str | None], list[int]] = {column: [0, 0] for column in columns}
        start = time.perf_counter()
        per_utterance[setting] = {}
        for subset, rows in subsets.items():
            hypotheses = recognizer.transcribe([path for _, path, _ in rows])
            per_utterance[setting][subset] = np.array([word_errors(reference, hypothesis)
                                                       for (_, _, reference), hypothesis in zip(rows, hypotheses)])
            for (utterance, _, _), (wrong, words) in zip(rows, per_utterance[setting][subset]):
                for column in ((subset, None), (subset, utterance.split("-")[0])):
                    if column in errors:
                        errors[column][0] += wrong
                        errors[column][1] += words
        cells = [f"{100 * wrong / words:.2f}" for wrong, words in errors.values()]
        print("| " + " | ".join([label, setting] + cells) + " |", flush=True)
        print(f"{setting}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    baseline = args.cmvn[0]
    print(f"\nWER change against {baseline} (points), 95% interval of a paired bootstrap over utterances\n")
    print("| model | CMVN | " + " | ".join(f"{subset} change" for subset in subsets) + " |")
    print("|" + "---|" * (2 + len(subsets)))
    for setting in args.cmvn[1:]:
        cells = [paired_interval(per_utterance[baseline][subset], per_utterance[setting][subset])
                 for subset in subsets]
        print("| " + " | ".join([label, setting] + [f"{c:+.2f} [{lo:+.2f}, {hi:+.2f}]" for c, lo, hi in cells]) + " |")


if __name__ == "__main__":
    main()
