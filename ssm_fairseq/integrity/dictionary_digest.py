"""Text models remember the dictionaries they were built with and refuse weights trained with other ones.

fairseq's text tasks (``language_modeling``, ``translation``, ``denoising``, ``masked_lm``,
``sentence_prediction``) read ``dict.txt`` from the data directory given on the command line, and a model's token
ids mean whatever that file lists. A corpus prepared again (``fairseq-preprocess`` builds a new ``dict.txt``: other
pieces, or the same ones in another order) gives an old checkpoint's ids other meanings; with as many entries as
before, every command ran on and printed numbers of nonsense. So each text model of this package keeps, per
dictionary, the SHA-256 of its symbols in id order as a buffer (``source_dictionary_digest``, and for the SPADE LM
and encoder-decoder ``target_dictionary_digest``, the decoder's): it is saved with the weights, and
``load_state_dict``, which every fairseq path into a model goes through (``fairseq-generate``, ``fairseq-eval-lm``,
``fairseq-validate``, resuming, ``--finetune-from-model``, this package's commands and LM fusion), compares it with
the digest of the dictionary the model was just built with, raising ``DictionaryMismatchError`` on a difference.
Weights saved before the digests existed load with a warning. The counts in ``dict.txt`` are not compared: they do
not change what an id means.
"""
from __future__ import annotations

import hashlib
import logging

import torch
from fairseq.data import Dictionary
from torch import Tensor

from .checkpoint_errors import DictionaryMismatchError

logger = logging.getLogger(__name__)

DIGEST_SUFFIX = "_dictionary_digest"


def dictionary_digest(dictionary: Dictionary) -> Tensor:
    """The SHA-256 of ``dictionary``'s symbols in id order, as 8 int64 values of 32 bits each ``(8,)``: small
    enough that averaging checkpoints (a sum, then a division) gives the same digest back exactly."""
    digest = hashlib.sha256("\n".join(dictionary.symbols).encode("utf-8")).digest()
    return torch.tensor([int.from_bytes(digest[i:i + 4], "big") for i in range(0, len(digest), 4)])


def digest_hex(digest: Tensor) -> str:
    """The first 12 hexadecimal digits of a ``dictionary_digest`` (as messages show SHA-256 digests)."""
    return "".join(f"{int(word):08x}" for word in digest)[:12]


class RemembersDictionaries:
    """Mixin for a fairseq model (before the fairseq base class): ``remember_dictionaries(source=..., ...)`` from
    ``build_model``, and ``load_state_dict`` refuses weights whose digests differ."""

    def remember_dictionaries(self, **dictionaries: Dictionary) -> None:
        """Keep the digest of each dictionary, by role (``source``, ``target``), as a buffer saved with the weights."""
        self.dictionary_sizes = {role: len(dictionary) for role, dictionary in dictionaries.items()}
        for role, dictionary in dictionaries.items():
            self.register_buffer(role + DIGEST_SUFFIX, dictionary_digest(dictionary))

    def load_state_dict(self, state_dict, strict: bool = True, model_cfg=None, args=None):
        for role, size in getattr(self, "dictionary_sizes", {}).items():  # none: built without build_model
            name = role + DIGEST_SUFFIX
            digest, stored = getattr(self, name), state_dict.get(name)
            if stored is None:
                logger.warning(f"the weights record no {role} dictionary digest (saved by an earlier version): cannot "
                               f"check that they were trained with this data directory's dictionary")
                state_dict[name] = digest.clone()
            elif not torch.equal(stored.to(digest.dtype), digest):
                raise DictionaryMismatchError(
                    f"trained with another {role} dictionary than this data directory's ({size} symbols): sha256 of "
                    f"the symbols {digest_hex(stored)} in the weights, {digest_hex(digest)} here, so its token ids "
                    f"would mean other tokens: use the data directory (dict.txt) it was trained with")
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
