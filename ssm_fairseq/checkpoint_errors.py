"""Checkpoint read errors that name the file: ``checkpoint PATH is truncated or not a checkpoint: ...``.

Every fairseq command reads checkpoints through ``fairseq.checkpoint_utils.load_checkpoint_to_cpu``
(``fairseq-generate --path``, ``fairseq-eval-lm --path``, ``fairseq-train --restore-file``, and our scripts).
On a truncated or foreign file ``torch.load`` raises errors that name no file (``PytorchStreamReader failed reading
zip archive: failed finding central directory``, ``EOFError``, ...). fairseq offers no hook between the command
line and that call, so importing this module (``ssm_fairseq/__init__.py`` does, and ``--user-dir`` imports the
package before any checkpoint is read) replaces the function in ``fairseq.checkpoint_utils``, once, by a wrapper
that re-raises those errors with the path in front of the original message, as the same exception type, chained
to the original. Arguments, return value and every other error pass through unchanged; fairseq calls the function
through the module, so its own calls get the wrapper too.
"""
from __future__ import annotations

import functools
import pickle

from fairseq import checkpoint_utils


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


def _naming_the_path(load):
    @functools.wraps(load)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            return load(path, *args, **kwargs)
        except (RuntimeError, EOFError, KeyError, pickle.UnpicklingError) as error:
            if not is_unreadable_file_error(error):
                raise
            reason = str(error)
            if isinstance(error, (EOFError, KeyError)):  # whose message alone ('101', or nothing) says little
                reason = f"{type(error).__name__} {reason}".rstrip()
            raise type(error)(f"checkpoint {path} is truncated or not a checkpoint: {reason}") from error

    load_checkpoint_to_cpu.names_the_path = True
    return load_checkpoint_to_cpu


if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "names_the_path", False):
    checkpoint_utils.load_checkpoint_to_cpu = _naming_the_path(checkpoint_utils.load_checkpoint_to_cpu)
