"""A data directory's ``config.yaml``: its vocabulary, CMVN and SpecAugment, paths relative to the directory."""
from __future__ import annotations

import logging
from pathlib import Path

import yaml

from ssm_fairseq.asr.features.running_cmvn import ADAPTIVE_CMVN
from .cmvn import GLOBAL_CMVN_STATS
from .manifests import replace_file

logger = logging.getLogger("prepare_librispeech")  # the log lines of every step of a preparation

SPECAUGMENT_LD = {"freq_mask_F": 27, "freq_mask_N": 2, "time_mask_N": 2, "time_mask_T": 100, "time_mask_p": 1.0,
                  "time_wrap_W": 0}


def write_config(out: Path, spm_name: str, time_mask_width: int | None = SPECAUGMENT_LD["time_mask_T"],
                 global_cmvn: bool = False, prior_frames: float | None = None) -> None:
    """``config.yaml``, written atomically; ``time_mask_width`` None: no SpecAugment; ``global_cmvn``: global CMVN
    with ``gcmvn.npz``, else utterance CMVN; ``prior_frames`` (with ``global_cmvn``): then ``adaptive_cmvn`` with
    that prior. Paths are relative to ``out`` (``audio_root: .``), which the
    ``speech_transducer`` task resolves against the data directory (``ssm_fairseq.asr.transducer.data_config``), so it
    can move."""
    cmvn = "global_cmvn" if global_cmvn else "utterance_cmvn"
    config = {
        "input_feat_per_channel": 80,
        "audio_root": ".",
        "vocab_filename": f"{spm_name}.txt",
        "bpe_tokenizer": {"bpe": "sentencepiece", "sentencepiece_model": f"{spm_name}.model"},
        "feature_transforms": {"_train": [cmvn], "*": [cmvn]},
    }
    if global_cmvn:
        config["global_cmvn"] = {"stats_npz_path": GLOBAL_CMVN_STATS}
        if prior_frames is not None:
            for names in config["feature_transforms"].values():
                names.append(ADAPTIVE_CMVN)
            config[ADAPTIVE_CMVN] = {"prior_frames": int(prior_frames) if float(prior_frames).is_integer()
                                     else prior_frames}
    if time_mask_width is not None:
        config["specaugment"] = {**SPECAUGMENT_LD, "time_mask_T": time_mask_width}
        config["feature_transforms"]["_train"].append("specaugment")
    path = out / "config.yaml"
    if path.is_file():
        before, after = (_located(c, out) for c in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}, config))
        changed = sorted(key for key in set(before) | set(after) if before.get(key) != after.get(key))
        if changed:  # e.g. SpecAugment switched on or off: training resumed on this directory changes with it
            logger.warning(f"{path}: replacing the data configuration of an earlier preparation (changed: "
                           f"{', '.join(changed)}); checkpoints trained on it were trained with the old one")
    replace_file(path, yaml.safe_dump(config, sort_keys=False).encode("utf-8"))


def _located(config: dict, out: Path) -> dict:
    """``config`` with its paths (``audio_root``, the global CMVN statistics) absolute: an earlier release wrote
    them absolute, this one relative to ``out``, and the two name the same files."""
    located = dict(config)
    if "audio_root" in config:
        located["audio_root"] = str((out / config["audio_root"]).resolve())
    stats = (config.get("global_cmvn") or {}).get("stats_npz_path")
    if stats:
        located["global_cmvn"] = {**config["global_cmvn"], "stats_npz_path": str((out / stats).resolve())}
    return located

