"""Checks on every checkpoint fairseq reads for this package, each failing in one line that names the file.

Every fairseq command reads checkpoints through ``fairseq.checkpoint_utils.load_checkpoint_to_cpu``
(``fairseq-generate --path``, ``fairseq-eval-lm --path``, ``fairseq-train --restore-file`` / ``checkpoint_last.pt``,
``ssm_fairseq.transcribe``, ``scripts/average_checkpoints.py``), which ``fairseq_patches`` makes call
``load_checked``. It

* tests the zip archive's CRC-32 of every member before ``torch.load`` (which does not): flipped bytes in a tensor
  raise ``checkpoint PATH is corrupted: member X fails its CRC check`` (``CheckpointError``);
* re-raises ``torch.load``'s errors on a truncated or foreign file (which name no file) with the path in front, as
  the same exception type, chained to the original (``checkpoint PATH is truncated or not a checkpoint: ...``);
* refuses NaN or inf in the model's parameters, naming the first such parameter (otherwise decoding would blame
  the audio for the scores they make, and training would go on from them);
* when ``fairseq-train`` resumes, compares the checkpoint's model configuration with the run's
  (``check_resumed_configuration``: ``config_differences``) and refuses a difference, naming the fields.

``finished_training`` says when a resumed checkpoint has already done ``--max-update`` updates (``fairseq_patches``
then ends ``fairseq-train``), and ``naming_the_checkpoint`` puts the checkpoint's path in front of a
``DictionaryMismatchError`` or ``FeatureMismatchError`` raised by the task that builds its model.

What is compared: every field of the stored model configuration (``cfg.model``) except dropout rates (fields whose
name contains ``dropout`` or ``layerdrop``: regularisation, which a resumed or fine-tuned run may change) and the
architecture's name (``_name``: ``--arch mssm_transducer`` and the same fields set by flags are the same model);
a field that one configuration lacks (a checkpoint saved before the field existed) counts as the model's default
for it.
``dictionary_fingerprint`` (filled by the ``speech_transducer`` task when training starts) is compared by content,
not by paths: the digests of the dictionary and SentencePiece model (``dictionary_fingerprint()``; the model's by
its pieces, scores, types and normalization where both sides record that: ``vocabulary_fingerprint``) and, under
the role ``features`` (``feature_fingerprint()``), the features the model was trained on:
``input_feat_per_channel``, the feature transforms evaluation splits get (names and options) and the digest of the
global CMVN statistics (``feature_differences``). A role that one side lacks (a checkpoint saved before it) is not
compared; resuming from
such a checkpoint warns. Models of argparse-only families keep the whole command line as ``cfg.model``; for them
only ``arch`` is compared.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import zipfile
from argparse import Namespace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from omegaconf import OmegaConf

from .checkpoint_errors import CheckpointError, DictionaryMismatchError, FeatureMismatchError
from ..asr.transducer.data_config import find_global_cmvn_stats
from ..architecture import registered_config_defaults
from .vocabulary_fingerprint import SENTENCEPIECE_ROLE, compared_digest, file_record, same_file, shown

logger = logging.getLogger(__name__)

# In cfg.model: {role: {"file": path, "sha256": hex digest}} for the dictionary files, and under FEATURES_ROLE
# {"input_feat_per_channel": N, "transforms": [...]} (feature_fingerprint; the key's name predates that role).
FINGERPRINT_KEY = "dictionary_fingerprint"
FEATURES_ROLE = "features"
EVALUATION_SPLIT = "_eval"  # config.yaml's transforms for splits not trained on: "_eval" if it has one, else "*"
TRANSFORM_NAMES = {"utterance_cmvn": "utterance CMVN", "global_cmvn": "global CMVN"}  # as messages name them


def is_unreadable_file_error(error: BaseException) -> bool:
    """Whether ``error`` from loading a checkpoint means its bytes are not a (whole) checkpoint.

    A zip archive cut short (``PytorchStreamReader``), a legacy pickle cut short (``unexpected EOF``, ``EOFError``),
    bytes that are no pickle (``UnpicklingError``, or ``KeyError`` from the unpickler's memo), or a pickle without
    fairseq's keys (``KeyError``). Not: a whole pickle holding a class that ``torch.load`` refuses to unpickle
    (``Unsupported global``), nor any other error.
    """
    message = str(error)
    if isinstance(error, pickle.UnpicklingError):
        return "Unsupported global" not in message
    if isinstance(error, RuntimeError):
        return "PytorchStreamReader" in message or "unexpected EOF" in message
    return isinstance(error, (EOFError, KeyError))


def corrupted_member(path: str | os.PathLike) -> str | None:
    """The first member of the zip checkpoint at ``path`` whose bytes fail their CRC-32 (or its local header), or
    None: none does, or the file is no readable zip archive (a legacy pickle; a truncated file, which ``torch.load``
    then reports)."""
    if not os.path.isfile(path) or not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip()
    except (zipfile.BadZipFile, OSError):  # a central directory that points outside the file: torch.load says so
        return None


UNINITIALISED_BUFFER = "_float_tensor"
"""fairseq's adaptive input and softmax register ``_float_tensor = torch.FloatTensor(1)``: uninitialised memory
that only carries a dtype and device, so it may hold anything, NaN included."""


def first_non_finite_parameter(model_state: Mapping[str, Any]) -> str | None:
    """``NAME (N of M values NaN or inf)`` for the first floating-point tensor of ``model_state`` holding NaN or
    inf, or None; fairseq's uninitialised ``_float_tensor`` placeholders are not values and are skipped."""
    for name, value in model_state.items():
        if name.rsplit(".", 1)[-1] == UNINITIALISED_BUFFER:
            continue
        if torch.is_tensor(value) and value.is_floating_point():
            bad = int((~torch.isfinite(value)).sum())
            if bad:
                return f"{name} ({bad} of {value.numel()} values NaN or inf)"
    return None


def dictionary_fingerprint(files: Mapping[str, str | os.PathLike]) -> dict[str, dict[str, Any]]:
    """``{role: file_record}`` for each existing file of ``files`` (``{"dictionary": ..., "sentencepiece_model":
    ...}``; ``vocabulary_fingerprint.file_record``: the bytes' digest, and a SentencePiece model's content digest);
    a missing file is left out."""
    return {role: file_record(Path(path), role) for role, path in files.items() if Path(path).is_file()}


def feature_fingerprint(data_cfg, split: str = EVALUATION_SPLIT) -> dict[str, Any]:
    """What the features of ``data_cfg`` (fairseq's ``S2TDataConfig``) are for ``split`` at evaluation:
    ``{"input_feat_per_channel": N, "transforms": [{"name": NAME, "options": {...}}, ...]}``, the transforms in the
    order they apply (``get_feature_transforms(split, is_train=False)``), each with its non-empty section of
    ``config.yaml`` as ``options``; ``global_cmvn``'s statistics file is recorded by content, as ``"file"`` (its
    absolute path: ``data_config.find_global_cmvn_stats``) and ``"sha256"``, not as an option:
    statistics that cannot be found raise ``FileNotFoundError`` naming them."""
    config = data_cfg.get_feature_transforms(split, False)
    transforms = []
    for name in config.get("feature_transforms") or []:
        options = dict(config.get(name) or {})
        transform: dict[str, Any] = {"name": name}
        if name == "global_cmvn":
            stats = find_global_cmvn_stats(options.pop("stats_npz_path", None), Path(data_cfg.root))
            transform.update(file_record(stats, FEATURES_ROLE))
        if options:
            transform["options"] = options
        transforms.append(transform)
    return {"input_feat_per_channel": data_cfg.input_feat_per_channel, "transforms": transforms}


def fingerprint_differences(first: Mapping | None, second: Mapping | None, first_label: str,
                            second_label: str) -> list[str]:
    """The roles whose files differ between two fingerprints, each as ``ROLE: FILE (sha256 ab12cd34ef56) in
    FIRST_LABEL, FILE (sha256 ...) in SECOND_LABEL`` (by content where both record it: ``vocabulary_fingerprint``),
    and for the ``features`` role ``feature_differences``; roles missing on either side are not compared.

    A SentencePiece model recorded by its bytes only (a fingerprint saved before content digests) whose bytes
    differ, with the same dictionary of units on both sides, is no difference but a warning: a preparation repeated
    elsewhere writes other bytes (the model records where it was trained), and the labels decode to the same
    units."""
    first, second = _plain(first) or {}, _plain(second) or {}
    differences = []
    for role in sorted(first.keys() & second.keys()):
        if role == FEATURES_ROLE:
            differences += feature_differences(first[role], second[role], first_label, second_label)
        elif not same_file(first[role], second[role]):
            key = compared_digest(first[role], second[role])
            difference = (f"{role}: {shown(first[role], key)} in {first_label}, {shown(second[role], key)} in "
                          f"{second_label}")
            if role == SENTENCEPIECE_ROLE and key == "sha256" and _same_role(first, second, "dictionary"):
                logger.warning(f"{difference}: recorded by its bytes (saved by an earlier version), which a "
                               f"preparation repeated elsewhere changes; the dictionary of units is the same, so it "
                               f"is accepted")
            else:
                differences.append(difference)
    return differences


def _same_role(first: Mapping, second: Mapping, role: str) -> bool:
    return role in first and role in second and same_file(first[role], second[role])


def feature_differences(first: Mapping, second: Mapping, first_label: str, second_label: str) -> list[str]:
    """How two ``feature_fingerprint`` records differ, at most one string each for ``input_feat_per_channel: 80 in
    FIRST_LABEL, 40 in SECOND_LABEL``, ``feature transforms: utterance CMVN in FIRST_LABEL, global CMVN from FILE in
    SECOND_LABEL`` (names and options) and, the transforms being the same, ``global CMVN statistics: FILE (sha256
    ab12cd34ef56) in FIRST_LABEL, FILE (sha256 ...) in SECOND_LABEL`` (by content: the same statistics at another
    path are no difference; a record without a digest is not compared: ``feature_fingerprint`` raises for a missing
    file)."""
    first, second = _plain(first), _plain(second)
    differences = []
    if first.get("input_feat_per_channel") != second.get("input_feat_per_channel"):
        differences.append(f"input_feat_per_channel: {first.get('input_feat_per_channel')} in {first_label}, "
                           f"{second.get('input_feat_per_channel')} in {second_label}")
    first_transforms, second_transforms = first.get("transforms") or [], second.get("transforms") or []
    if _transform_settings(first_transforms) != _transform_settings(second_transforms):
        differences.append(f"feature transforms: {_transforms_shown(first_transforms)} in {first_label}, "
                           f"{_transforms_shown(second_transforms)} in {second_label}")
        return differences
    for a, b in zip(first_transforms, second_transforms):
        if a.get("sha256") and b.get("sha256") and a["sha256"] != b["sha256"]:
            what = TRANSFORM_NAMES.get(a["name"], a["name"])
            differences.append(f"{what} statistics: {a['file']} (sha256 {a['sha256'][:12]}) in {first_label}, "
                               f"{b['file']} (sha256 {b['sha256'][:12]}) in {second_label}")
    return differences


def _transform_settings(transforms: list) -> list:
    return [(t["name"], t.get("options") or {}) for t in transforms]


def _transforms_shown(transforms: list) -> str:
    """``utterance CMVN``, ``global CMVN from FILE``, ``delta_deltas {'win_length': 3}, then utterance CMVN``."""
    if not transforms:
        return "no feature transform"
    shown = []
    for transform in transforms:
        text = TRANSFORM_NAMES.get(transform["name"], transform["name"])
        if "file" in transform:
            text += f" from {transform['file']}"
        if transform.get("options"):
            text += f" {transform['options']}"
        shown.append(text)
    return ", then ".join(shown)


def is_architecture_field(name: str) -> bool:
    """Whether model field ``name`` is compared between checkpoints (see the module's docstring)."""
    return name != "_name" and "dropout" not in name and "layerdrop" not in name and name != FINGERPRINT_KEY


def config_differences(first: Any, second: Any, first_label: str, second_label: str) -> list[str]:
    """The differences between two model configurations (``cfg.model``, stored or live), one string each:
    ``FIELD: VALUE in FIRST_LABEL, VALUE in SECOND_LABEL`` for architecture fields, then the dictionary files
    (``fingerprint_differences``)."""
    first, second = _plain(first), _plain(second)
    if isinstance(first, Namespace) or isinstance(second, Namespace):  # argparse models: the whole command line
        first, second = ({"arch": getattr(c, "arch", None) if isinstance(c, Namespace) else c.get("_name")}
                         for c in (first, second))
    # a field that one side lacks (saved before it existed) has its default there: what that release did
    defaults = registered_config_defaults(first.get("_name") or second.get("_name"))
    missing = object()

    def value(cfg: Mapping, name: str) -> Any:
        return cfg.get(name, defaults.get(name, missing))

    differences = [f"{name}: {_shown(value(first, name))} in {first_label}, {_shown(value(second, name))} in "
                   f"{second_label}"
                   for name in sorted(first.keys() | second.keys(), key=_field_order(first, second))
                   if is_architecture_field(name) and not _same(value(first, name), value(second, name))]
    return differences + fingerprint_differences(first.get(FINGERPRINT_KEY), second.get(FINGERPRINT_KEY),
                                                 first_label, second_label)


def _plain(cfg: Any) -> Any:
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True) if OmegaConf.is_config(cfg) else cfg


def _field_order(first: Mapping, second: Mapping):
    order = {name: n for n, name in enumerate([*first, *(name for name in second if name not in first)])}
    return order.__getitem__


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _shown(value: Any) -> str:
    return "(absent)" if not isinstance(value, (str, int, float, bool, type(None), list, dict)) else repr(value)


def check_resumed_configuration(path: str, stored_model_cfg: Any, current_model_cfg: Any) -> None:
    """Refuse to resume training from checkpoint ``path`` with another model configuration; warn when the
    checkpoint predates dictionary fingerprints, or feature fingerprints."""
    differences = config_differences(stored_model_cfg, current_model_cfg, "the checkpoint", "this run")
    if differences:
        raise CheckpointError(f"checkpoint {path} holds another model than this run's flags describe: "
                              f"{'; '.join(differences)}. Resume with the checkpoint's flags (and on the data "
                              f"directory it was trained on), or train in another --save-dir (dropout rates may "
                              f"change)")
    stored, current = (_plain(cfg) or {} for cfg in (stored_model_cfg, current_model_cfg))
    if FINGERPRINT_KEY not in stored and FINGERPRINT_KEY in current:
        logger.warning(f"checkpoint {path} records no dictionary fingerprint (saved by an earlier version): "
                       f"cannot check that it was trained with this run's dictionary")
    stored_roles, current_roles = (getattr(cfg, FINGERPRINT_KEY, None) if isinstance(cfg, Namespace)
                                   else cfg.get(FINGERPRINT_KEY) for cfg in (stored, current))
    if FEATURES_ROLE not in (stored_roles or {}) and FEATURES_ROLE in (current_roles or {}):
        logger.warning(f"checkpoint {path} records no feature fingerprint (saved by an earlier version): cannot "
                       f"check that it was trained on this run's features (feature transforms, CMVN statistics)")


def load_checked(path: str | os.PathLike, load: Callable[[], dict], resumed_model_cfg: Any = None) -> dict:
    """The state that ``load()`` reads from checkpoint ``path`` (``fairseq.checkpoint_utils.load_checkpoint_to_cpu``),
    checked before and after: its zip members' CRCs, its readability (``torch.load``'s error with the path in front,
    the same exception type, chained), the finiteness of its weights and, given ``resumed_model_cfg`` (the resuming
    run's ``cfg.model``), that it holds the same model (``check_resumed_configuration``); each failure names
    ``path``."""
    member = corrupted_member(path)
    if member is not None:
        raise CheckpointError(f"checkpoint {path} is corrupted: member {member} fails its CRC check (damaged "
                              f"bytes): copy it again or use another epoch's checkpointN.pt")
    try:
        state = load()
    except (RuntimeError, EOFError, KeyError, pickle.UnpicklingError) as error:
        if not is_unreadable_file_error(error):
            raise
        reason = str(error)
        if isinstance(error, (EOFError, KeyError)):  # whose message alone ('101', or nothing) says little
            reason = f"{type(error).__name__} {reason}".rstrip()
        raise type(error)(f"checkpoint {path} is truncated or not a checkpoint: {reason}") from error
    bad = first_non_finite_parameter(state.get("model") or {})
    if bad is not None:
        raise CheckpointError(f"checkpoint {path} has non-finite weights: parameter {bad}; the model is "
                              f"damaged (training diverged or the file was altered): use another checkpoint")
    if resumed_model_cfg is not None and state.get("cfg") is not None:
        check_resumed_configuration(path, state["cfg"]["model"], resumed_model_cfg)
    return state


def finished_training(path: str, num_updates: int, max_update: int) -> str | None:
    """Why a run resumed from ``path`` after ``num_updates`` updates has nothing to train under ``--max-update
    max_update`` (0: no limit), or None if it has."""
    if 0 < max_update <= num_updates:
        return (f"{path} has done {num_updates} updates, --max-update is {max_update}: nothing to train, its "
                f"checkpoints left as they are")
    return None


@contextlib.contextmanager
def naming_the_checkpoint(names: str):
    """Put ``checkpoint NAMES:`` in front of a ``DictionaryMismatchError`` or ``FeatureMismatchError`` raised inside
    (the task that builds a model from a checkpoint's configuration does not know the checkpoint's path)."""
    try:
        yield
    except (DictionaryMismatchError, FeatureMismatchError) as error:
        raise type(error)(f"checkpoint {names}: {error}") from error
