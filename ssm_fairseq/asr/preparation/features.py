"""Filterbank features of a subset's utterances on several processes, resumable: a feature file is reused while the
audio it was computed from is unchanged (its ``.source`` stamp)."""
from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ssm_fairseq.asr.features.audio_features import NUM_MEL_BINS, AudioError, filterbank_features
from ssm_fairseq.asr.features.feature_files import npy_shape
from .corpus import Utterance

logger = logging.getLogger("prepare_librispeech")  # the log lines of every step of a preparation


@dataclass
class ExtractedSubset:
    """A subset after feature extraction: the utterances with features, their frames, the ``feature_sums`` of their
    features (``--cmvn global``, training subsets; else None) and every problem found in the subset."""

    utterances: list[Utterance]
    frames: dict[str, int]  # utterance id -> frames
    sums: np.ndarray | None
    problems: list[str]


def source_stamp(audio: Path) -> str:
    """What identifies the audio a feature file was computed from: its place in the corpus (``SPK/CHAPTER/FILE``),
    size and modification time."""
    status = audio.stat()
    return f"{'/'.join(audio.parts[-3:])}\t{status.st_size}\t{status.st_mtime_ns}\n"


def stored_frames(utterance: Utterance, stamp: str) -> int | None:
    """The frames of the utterance's stored features if they are complete and computed from the audio as it is
    now (its ``.source`` stamp equals ``stamp``), else None (to compute: new, changed, or cut short)."""
    try:
        if utterance.features.with_suffix(".source").read_text(encoding="utf-8") != stamp:
            return None
        shape = npy_shape(utterance.features)
    except (OSError, ValueError):  # no stamp, a stamp that is not text, features cut short
        return None
    return shape[0] if len(shape) == 2 and shape[0] > 0 and shape[1] == NUM_MEL_BINS else None


def feature_sums(features: np.ndarray) -> np.ndarray:
    """``T x 80`` features -> ``2 x 80`` float64: each bin's sum over the frames, and its sum of squares."""
    features = features.astype(np.float64)
    return np.stack([features.sum(axis=0), np.square(features).sum(axis=0)])


def extract(utterance: Utterance, sums: bool = False) -> tuple[str, int | str, str | None, np.ndarray | None]:
    """Compute and store one utterance's features and source stamp -> ``(id, frames, conversion, sums)``, or
    ``(id, problem, None, None)``; features stored from the same audio are reused (``stored_frames``). ``sums``:
    also their ``feature_sums`` (read back from the stored file when reused), else None."""
    try:
        stamp = source_stamp(utterance.audio)
        frames = stored_frames(utterance, stamp)
        if frames is not None:
            if not sums:
                return utterance.id, frames, None, None
            try:
                return utterance.id, frames, None, feature_sums(np.load(utterance.features))
            except (OSError, ValueError):  # changed since its header was read: computed again below
                pass
        features, conversion = filterbank_features(utterance.audio)
    except AudioError as error:
        return utterance.id, f"{utterance.audio}: utterance {utterance.id}: {error.problem}", None, None
    except OSError as error:
        return utterance.id, f"{utterance.audio}: utterance {utterance.id}: unreadable audio ({error})", None, None
    stamp_file = utterance.features.with_suffix(".source")
    stamp_file.unlink(missing_ok=True)  # no stamp of other audio beside these features, even if we stop midway
    utterance.features.parent.mkdir(parents=True, exist_ok=True)
    partial = utterance.features.with_suffix(".partial.npy")
    np.save(partial, features)
    partial.replace(utterance.features)
    partial_stamp = stamp_file.with_suffix(".partial.source")
    partial_stamp.write_text(stamp, encoding="utf-8")
    partial_stamp.replace(stamp_file)
    return utterance.id, features.shape[0], conversion, feature_sums(features) if sums else None


def _init_worker() -> None:
    torch.set_num_threads(1)


def extract_all(utterances: list[Utterance], jobs: int, label: str,
                sums: bool = False) -> tuple[dict[str, int | str], np.ndarray | None]:
    """Features of every utterance on ``jobs`` processes, logging progress -> (id: frames or problem, the
    ``feature_sums`` of all the utterances with features if ``sums``, else None).

    The sums are accumulated in float64 in the order of ``utterances`` (``Pool.imap``, not ``imap_unordered``),
    whichever process finishes first, so that the same features give the same sums bit for bit."""
    results: dict[str, int | str] = {}
    total = np.zeros((2, NUM_MEL_BINS), dtype=np.float64) if sums else None
    work = functools.partial(extract, sums=True) if sums else extract
    conversions: dict[str, int] = {}
    start, every = time.time(), max(1, len(utterances) // 20)
    chunk = 8
    jobs = min(jobs, -(-len(utterances) // chunk))  # no process without a chunk of utterances to do
    with contextlib.ExitStack() as stack:
        if jobs > 1:
            pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(jobs, initializer=_init_worker))
            finished = (pool.imap if sums else pool.imap_unordered)(work, utterances, chunksize=chunk)
        else:
            finished = map(work, utterances)
        for done, (utterance_id, result, conversion, result_sums) in enumerate(finished, 1):
            results[utterance_id] = result
            if result_sums is not None:
                total += result_sums
            if conversion:
                conversions[conversion] = conversions.get(conversion, 0) + 1
            if done % every == 0 or done == len(utterances):
                elapsed = time.time() - start
                logger.info(f"{label}: {done}/{len(utterances)} utterances, {elapsed:.0f}s elapsed, "
                            f"about {elapsed / done * (len(utterances) - done):.0f}s left")
    for conversion, count in sorted(conversions.items()):
        logger.info(f"{label}: {count} utterances not 16 kHz mono: {conversion} (to 16 kHz mono)")
    return results, total


def extract_subset(out: Path, subset: str, utterances: list[Utterance], problems: list[str], jobs: int,
                   sums: bool) -> ExtractedSubset:
    """The features of a subset's ``utterances`` (``extract_all``); the problems of reading it (``problems``, which
    the extraction's are added to) logged as errors and listed in ``out/SUBSET.rejected.tsv`` (removed when there
    are none)."""
    results, subset_sums = extract_all(utterances, jobs, subset, sums)
    problems += [result for result in results.values() if isinstance(result, str)]
    frames = {uid: result for uid, result in results.items() if isinstance(result, int)}
    rejected = out / f"{subset}.rejected.tsv"
    rejected.unlink(missing_ok=True)  # no list left from an earlier run
    if problems:
        for problem in problems:
            logger.error(problem)
        rejected.write_text("".join(p + "\n" for p in problems), encoding="utf-8")
    return ExtractedSubset([u for u in utterances if u.id in frames], frames, subset_sums, problems)

