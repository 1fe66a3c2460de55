"""Which CMVN a data directory applies (utterance, global or adaptive), checked on a re-run, and the training set's
global statistics (``gcmvn.npz``)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

from ssm_fairseq.asr.features.running_cmvn import ADAPTIVE_CMVN

if TYPE_CHECKING:  # an annotation only: the features need no CMVN
    from .features import ExtractedSubset

logger = logging.getLogger("prepare_librispeech")  # the log lines of every step of a preparation

CMVN_CHOICES = ("utterance", "global", "adaptive")  # --cmvn: fairseq's utterance_cmvn, global_cmvn, + adaptive_cmvn
GLOBAL_STATS_CMVNS = ("global", "adaptive")  # the --cmvn choices that need the training set's gcmvn.npz
GLOBAL_CMVN_STATS = "gcmvn.npz"  # the global statistics' file in a data directory (--cmvn global, adaptive)
DEFAULT_PRIOR_FRAMES = 300  # --cmvn adaptive: frames of the training statistics pooled with an utterance's own
GLOBAL_CMVN_VARIANCE_FLOOR = 1e-8  # fairseq's cal_gcmvn_stats (examples/speech_to_text/data_utils.py)


class CmvnError(Exception):
    """This run's ``--cmvn`` differs from the CMVN of the ``config.yaml`` already in ``--out``."""


def configured_cmvn(config: dict) -> str:
    """The CMVN a ``config.yaml`` (as a dict) applies: ``"adaptive"``, ``"global"``, ``"utterance"`` or ``"none"``."""
    transforms = config.get("feature_transforms") or config.get("transforms") or {}
    names = {name for names in transforms.values() for name in (names or [])}
    for cmvn, transform in (("adaptive", ADAPTIVE_CMVN), ("global", "global_cmvn"), ("utterance", "utterance_cmvn")):
        if transform in names:
            return cmvn
    return "none"


def check_cmvn(out: Path, cmvn: str, overwrite: bool) -> None:
    """``CmvnError`` if ``out/config.yaml`` exists and applies another CMVN than ``cmvn`` (unless ``overwrite``, which
    logs a warning): models trained on ``out`` were trained on features normalised the other way."""
    path = out / "config.yaml"
    if not path.is_file():
        return
    existing = configured_cmvn(yaml.safe_load(path.read_text(encoding="utf-8")) or {})
    if existing == cmvn:
        return
    if not overwrite:
        raise CmvnError(
            f"this run's --cmvn {cmvn} differs from {path}, which uses {existing} CMVN and which models trained on "
            f"{out} use (their features were normalised the other way): prepare into a new --out, or pass "
            f"--overwrite-cmvn to replace it")
    logger.warning(f"--overwrite-cmvn: {path} switches from {existing} to {cmvn} CMVN; checkpoints trained on it "
                   f"no longer get the features they were trained on")


def global_cmvn_stats(frames: int, sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``frames`` and the ``2 x 80`` float64 sums of their values and squares -> (mean, std), ``80`` float32 each,
    as fairseq's ``cal_gcmvn_stats`` computes them (variance floored at 1e-8). No frames: ``ValueError``."""
    if frames < 1:
        raise ValueError("global CMVN: the training subsets have no frames (every utterance was left out)")
    mean = sums[0] / frames
    variance = sums[1] / frames - mean ** 2
    std = np.sqrt(np.maximum(variance, GLOBAL_CMVN_VARIANCE_FLOOR))
    return mean.astype(np.float32), std.astype(np.float32)


def write_global_cmvn(out: Path, mean: np.ndarray, std: np.ndarray) -> Path:
    """``out/gcmvn.npz`` (``mean``, ``std``, as fairseq's ``GlobalCMVN`` reads them), written atomically -> its
    path. A different one already there is replaced with a warning."""
    path = out / GLOBAL_CMVN_STATS
    if path.is_file():
        try:
            with np.load(path) as before:
                same = np.array_equal(before["mean"], mean) and np.array_equal(before["std"], std)
        except (OSError, ValueError, KeyError):
            same = False
        if same:
            return path
        logger.warning(f"{path}: replacing the global CMVN statistics of an earlier preparation (other training "
                       f"audio?); checkpoints trained on {out} were trained with the old ones")
    partial = path.with_name(f"{path.stem}.partial.npz")
    with open(partial, "wb") as f:
        np.savez(f, mean=mean, std=std)
    partial.replace(path)
    return path


def update_global_cmvn(out: Path, global_cmvn: bool, train_subsets: list[str],
                       extracted: dict[str, ExtractedSubset]) -> None:
    """With ``global_cmvn``, ``out/gcmvn.npz`` from the training subsets' feature sums; else a ``gcmvn.npz`` left by
    an earlier global-CMVN preparation is removed."""
    if global_cmvn:  # in a fixed order, so that the same features give the same statistics bit for bit
        training = list(dict.fromkeys(train_subsets))  # each subset once
        count = sum(sum(extracted[subset].frames.values()) for subset in training)
        mean, std = global_cmvn_stats(count, sum(extracted[subset].sums for subset in training))
        logger.info(f"global CMVN over {count} frames of {', '.join(training)} -> {write_global_cmvn(out, mean, std)}")
    else:
        stale = out / GLOBAL_CMVN_STATS
        if stale.is_file():  # left by a --cmvn global preparation that --overwrite-cmvn replaced
            stale.unlink()
            logger.warning(f"{stale}: removed (this directory now uses utterance CMVN)")

