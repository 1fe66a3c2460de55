"""Checks on an ``--lm-path`` checkpoint before its weights are loaded: a language model, over the transducer's units.

``fairseq-generate --lm-path LM`` (and ``ssm-transcribe --lm-path``) loads the LM with the speech data directory's
``dict.txt`` (``arg_overrides={"data": DATA}``, fairseq's convention), so the dictionary the loaded LM reports is that
file, whatever the LM was trained on. An LM binarised without ``--srcdict DATA/dict.txt`` (``fairseq-preprocess``
then orders the units by frequency) has as many units in another order and would be fused silently wrong; one of
another size fails in ``load_state_dict`` with a size mismatch. So the check reads what the checkpoint records of
its training, before fairseq builds the model:

* its training data directory (``cfg.task.data``, its first path, as fairseq's ``language_modeling`` task reads it)
  and that directory's ``dict.txt``, if it still exists and agrees with the weights (same size, same digest);
* the dictionary digests that this package's text models keep with their weights (``spade_lm``:
  ``integrity/dictionary_digest.py``);
* the size of its token embedding (``decoder.embed_tokens``; adaptive input keeps it in bands, ``embeddings.N.0``,
  whose sizes add up to the dictionary's), which is the dictionary's size, ``madeupwordNNNN`` padding included:
  ``fairseq-preprocess`` writes the symbols it pads a dictionary with into ``dict.txt`` (``--padding-factor``, 8 by
  default; ``--srcdict`` dictionaries are not padded), and ``Dictionary.load`` reads them back as units.

A dictionary read is compared unit by unit with ``DATA/dict.txt`` (the first difference or both sizes are named);
without one, the size and the digest are; where nothing can be compared, a warning says what could not be checked.
A checkpoint of another kind of model (e.g. the transducer itself) is refused, naming its task and architecture.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

import torch
from fairseq import checkpoint_utils, utils
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY, FairseqLanguageModel
from torch import Tensor

from .dictionary_digest import DIGEST_SUFFIX, dictionary_digest, digest_hex
from ..asr.search.lm_fusion import LanguageModelMismatchError, NotALanguageModelError, check_same_units

logger = logging.getLogger(__name__)

LM_DICTIONARY = "dict.txt"  # where fairseq's language_modeling task reads a data directory's dictionary
# The token embedding's weight: one table, or adaptive input's bands (each an Embedding, then a projection).
EMBEDDING_KEY = re.compile(r"decoder\.embed_tokens\.(?:weight|embeddings\.\d+\.0\.weight)")


def lm_dictionary_file(data_dir: Path | str, lm_path: Path | str) -> Path:
    """``data_dir``'s ``dict.txt``, which fusion loads the LM with; ``FileNotFoundError`` saying what to do if it is
    absent."""
    dictionary = Path(data_dir) / LM_DICTIONARY
    if not dictionary.is_file():
        raise FileNotFoundError(
            f"{dictionary}: not found; --lm-path {lm_path}: fusion loads the language model with {dictionary}, which "
            f"does not exist: copy the transducer's dictionary there (config.yaml's vocab_filename; "
            f"ssm-prepare-librispeech writes it) and train the LM with fairseq-preprocess --srcdict {dictionary}")
    return dictionary


def read_checkpoint(path: Path | str) -> dict:
    """The checkpoint's state as saved (no overrides), read through fairseq (and this package's checks)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"language model not found: {path}")
    return checkpoint_utils.load_checkpoint_to_cpu(str(path))


def _name(cfg, *fields: str) -> str | None:
    """The first of ``fields`` that ``cfg`` (a dataclass config or a legacy argparse ``Namespace``) sets."""
    return next((value for value in (getattr(cfg, field, None) for field in fields) if value), None)


def check_is_language_model(path: Path | str, state: dict) -> None:
    """Refuse a checkpoint whose architecture is not a ``FairseqLanguageModel`` (fusion steps an LM's decoder)."""
    cfg = state["cfg"]
    arch = _name(cfg.model, "_name", "arch")
    model_class = ARCH_MODEL_REGISTRY.get(arch)
    if model_class is None or issubclass(model_class, FairseqLanguageModel):
        return  # an architecture not registered here: fairseq names it when it builds the model
    task = _name(cfg.task, "_name", "task")
    raise NotALanguageModelError(
        f"--lm-path {path}: a checkpoint of --task {task} --arch {arch} (a {model_class.__name__}), not a language "
        f"model: fusion needs a fairseq-train --task language_modeling checkpoint (e.g. --arch transformer_lm or "
        f"spade_lm) trained over the transducer's units")


def vocabulary_size(weights: dict[str, Tensor]) -> int | None:
    """The number of units the LM's token embedding has (the dictionary it was trained with), None if not found."""
    rows = [tensor.shape[0] for key, tensor in weights.items() if EMBEDDING_KEY.fullmatch(key)]
    return sum(rows) if rows else None


def stored_digests(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """The dictionary digests saved with the weights, by buffer name (``spade_lm``: source and target)."""
    return {key: tensor for key, tensor in weights.items() if key.endswith(DIGEST_SUFFIX) and "." not in key}


def training_dictionary_file(state: dict) -> Path | None:
    """The ``dict.txt`` of the data directory the LM was trained on (``cfg.task.data``'s first path)."""
    data = _name(state["cfg"].task, "data")
    return Path(utils.split_paths(str(data))[0]) / LM_DICTIONARY if data else None


def _disagreement(dictionary: Dictionary, size: int | None, digests: dict[str, Tensor]) -> str | None:
    """Why ``dictionary`` is not the one the weights were trained with (another size or digest), or None."""
    if size is not None and size != len(dictionary):
        return f"it has {len(dictionary)} units and the weights' embedding {size}"
    digest = dictionary_digest(dictionary)
    for name, stored in digests.items():
        if not torch.equal(stored.to(digest.dtype), digest):
            return f"its digest is {digest_hex(digest)} and the weights' {name} {digest_hex(stored)}"
    return None


def trained_dictionary(path: Path | str, state: dict, size: int | None,
                       digests: dict[str, Tensor]) -> tuple[Dictionary | None, str]:
    """The dictionary the LM was trained with, read from its data directory if it is still there and agrees with
    the weights; else None, and why it could not be used (for the warning)."""
    file = training_dictionary_file(state)
    if file is None:
        return None, "the checkpoint records no training data directory (cfg.task.data)"
    if not file.is_file():
        return None, f"its training data directory's {file} (cfg.task.data) no longer exists"
    dictionary = Dictionary.load(str(file))
    why = _disagreement(dictionary, size, digests)
    if why is not None:
        logger.warning(f"--lm-path {path}: {file} is not the dictionary the language model was trained with ({why}; "
                       f"was it rewritten?): not used to check the LM's units")
        return None, f"its training data directory's {file} no longer matches its weights"
    return dictionary, str(file)


def check_trained_units(path: Path | str, state: dict, reference: Dictionary, reference_file: Path) -> None:
    """Refuse an LM trained over other units than ``reference`` (``DATA/dict.txt``, the transducer's units) or in
    another order; warn where the checkpoint leaves that unchecked."""
    weights = state["model"]
    size, digests = vocabulary_size(weights), stored_digests(weights)
    remedy = f"fairseq-preprocess --only-source --srcdict {reference_file}"
    own, source = trained_dictionary(path, state, size, digests)
    if own is not None:
        check_same_units(own, reference, f"the language model {path} (trained with {source})", remedy)
        return
    if size is not None and size != len(reference):
        raise LanguageModelMismatchError(
            f"the language model {path} has {size} units (its embedding; {source}) and the transducer "
            f"{len(reference)} ({reference_file}): fusion needs an LM trained over the transducer's dictionary "
            f"({remedy})")
    digest = dictionary_digest(reference)
    for name, stored in digests.items():
        if not torch.equal(stored.to(digest.dtype), digest):
            raise LanguageModelMismatchError(
                f"the language model {path} was trained with another dictionary than {reference_file} (the "
                f"transducer's): its {name} is {digest_hex(stored)}, {reference_file}'s {digest_hex(digest)}, so "
                f"its units are others or in another order: fusion needs an LM trained over the transducer's "
                f"dictionary ({remedy})")
    if digests:
        return
    sized = (f"its {size} units are as many as the transducer's" if size is not None
             else "its weights show no token embedding to count its units")
    logger.warning(
        f"--lm-path {path}: cannot check that the language model was trained over the transducer's units in their "
        f"order: {source}, its weights store no dictionary digest (spade_lm's do) and {sized}. An LM binarised "
        f"without --srcdict orders the units by frequency and is fused silently wrong: make sure its text was "
        f"binarised with {remedy}")


def check_language_model(path: Path | str, data_dir: Path | str) -> None:
    """Everything fusion needs of ``path`` before its weights are loaded with ``data_dir``'s ``dict.txt``: the file,
    a language model, trained over that dictionary's units in its order (``check_trained_units``)."""
    reference_file = lm_dictionary_file(data_dir, path)
    state = read_checkpoint(path)
    check_is_language_model(path, state)
    check_trained_units(path, state, Dictionary.load(str(reference_file)), reference_file)


def load_language_model(path: Path | str, data_dir: Path | str, device: torch.device):
    """A fairseq language model for fusion, loaded as ``fairseq-generate --lm-path`` loads it: with its task's data
    replaced by ``data_dir`` (whose ``dict.txt`` is then its dictionary), in eval mode on ``device``; checked first
    (``check_language_model``)."""
    check_language_model(path, data_dir)
    models, cfg = checkpoint_utils.load_model_ensemble([str(path)], arg_overrides={"data": str(data_dir)})
    lm = models[0]
    lm.prepare_for_inference_(cfg)  # eval mode, as fairseq-generate prepares it
    lm.to(device)
    return lm
