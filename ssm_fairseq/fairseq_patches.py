"""Every fairseq function this package replaces, each where fairseq offers no hook for what it adds; ``apply()``
installs them all, once (``registration`` calls it when fairseq is imported).

A patch replaces ``owner.name`` by a wrapper that calls the original (``functools.wraps``: ``__wrapped__`` is the
original, which ``tests/test_fairseq_patches.py`` checks against what the wrapper expects of it, so that a fairseq
upgrade that changes it fails there, naming the function). The checks the wrappers run live elsewhere:
``checkpoint_checks`` (CRCs, finite weights, the resumed model's configuration, when training is finished) and
``models/task_check`` (a task's ``--arch``). fairseq calls the patched functions through their module or class
(``checkpoint_utils.load_checkpoint_to_cpu``, ``trainer.load_checkpoint``, ``TASK_REGISTRY[name].add_args``), so its
own calls reach the wrappers.

Not patches, and so not here: ``registration`` finds out when fairseq is imported through an import hook (a finder
in ``sys.meta_path``, Python's own hook); ``ssm_fairseq/__init__.py`` drops fairseq's "Please install tensorboardX"
log line with a ``logging.Filter`` (logging's own hook), which must be in place before fairseq is imported, and
this module imports fairseq.
"""
from __future__ import annotations

import argparse
import contextlib
import contextvars
import functools
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable

from fairseq import checkpoint_utils
from fairseq.tasks import TASK_REGISTRY
from fairseq.trainer import Trainer

from .integrity.checkpoint_checks import finished_training, load_checked, naming_the_checkpoint
from .integrity.checkpoint_errors import DictionaryMismatchError
from .integrity.task_check import check_arch_when_parsed, checked_text_tasks, text_task_arch_error

logger = logging.getLogger(__name__)

PATCH_MARK = "_ssm_fairseq_patch"  # set on each wrapper: what makes apply() idempotent
_resumed_model_cfg: contextvars.ContextVar = contextvars.ContextVar("resumed_model_cfg", default=None)


@dataclass(frozen=True)
class Patch:
    """fairseq's ``owner.name`` (a module's function, a class's method, static method or class method) replaced by
    ``wrap(original)``; a static or class method's wrapper is installed as a static method of ``owner``."""

    owner: Any
    name: str
    wrap: Callable[[Callable], Callable]

    def installed(self) -> Callable | None:
        """The wrapper ``owner`` holds itself (not one a base class holds), or None."""
        own = vars(self.owner).get(self.name)
        function = getattr(own, "__func__", own)  # a staticmethod's function
        return function if getattr(function, PATCH_MARK, False) else None

    def original(self) -> Callable:
        """fairseq's function, patched or not (a class method bound to ``owner``)."""
        installed = self.installed()
        return installed.__wrapped__ if installed is not None else getattr(self.owner, self.name)

    def apply(self) -> None:
        """Install the wrapper unless ``owner`` holds it already."""
        if self.installed() is not None:
            return
        wrapper = self.wrap(getattr(self.owner, self.name))
        setattr(wrapper, PATCH_MARK, True)
        method = inspect.getattr_static(self.owner, self.name)
        setattr(self.owner, self.name,
                staticmethod(wrapper) if isinstance(method, (staticmethod, classmethod)) else wrapper)


def checking_every_checkpoint(load_checkpoint_to_cpu: Callable) -> Callable:
    """``checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False) -> state`` made to
    check what it reads (``checkpoint_checks.load_checked``), and the resumed run's model given by
    ``comparing_the_resumed_model``.

    Why a patch: every fairseq command and checkpoint reader of fairseq's reads through this one function, and
    fairseq calls nothing between the command line and it. Relied on: ``path`` first, the rest passed through; a
    dict with ``"model"`` (name -> tensor) and ``"cfg"`` (``cfg["model"]``) returned; ``torch.load``'s errors raised
    as they are (``checkpoint_checks.is_unreadable_file_error``)."""

    @functools.wraps(load_checkpoint_to_cpu)
    def checked_load_checkpoint_to_cpu(path, *args, **kwargs):
        return load_checked(path, lambda: load_checkpoint_to_cpu(path, *args, **kwargs), _resumed_model_cfg.get())

    return checked_load_checkpoint_to_cpu


def naming_the_checkpoint_of_a_model(load_model_ensemble_and_task: Callable) -> Callable:
    """``checkpoint_utils.load_model_ensemble_and_task(filenames, ...) -> (models, cfg, task)`` made to put the
    checkpoint's path in front of a ``DictionaryMismatchError`` or ``FeatureMismatchError`` of the task that builds
    its model (``checkpoint_checks.naming_the_checkpoint``).

    Why a patch: ``fairseq-generate`` and ``fairseq-eval-lm`` build the model inside this function, from the
    checkpoint's configuration, and the task's ``build_model`` is not told the path. Relied on: ``filenames``
    first (a list of paths), the rest passed through; the task's errors propagated unchanged."""

    @functools.wraps(load_model_ensemble_and_task)
    def named_load_model_ensemble_and_task(filenames, *args, **kwargs):
        with naming_the_checkpoint(filenames[0] if len(filenames) == 1 else f"one of {', '.join(filenames)}"):
            return load_model_ensemble_and_task(filenames, *args, **kwargs)

    return named_load_model_ensemble_and_task


def comparing_the_resumed_model(load_checkpoint: Callable) -> Callable:
    """``Trainer.load_checkpoint(self, filename, ...) -> extra_state`` (None: no such file) made to

    * give ``checking_every_checkpoint`` the run's model configuration (``self.cfg.model``) while it reads
      ``filename``, so that resuming with another model is refused;
    * put ``filename`` in front of a ``DictionaryMismatchError`` raised while loading the weights, which fairseq
      replaces by "Cannot load model parameters ... please ensure that the architectures match" (its
      ``__context__``);
    * end ``fairseq-train`` (exit 0, logging why) when the checkpoint has already done ``--max-update`` updates
      (``self.get_num_updates()``, ``self.cfg.optimization.max_update``; ``checkpoint_checks.finished_training``).

    Why a patch: ``fairseq-train`` (``fairseq_cli.train.main``) resumes through this method and has no hook between
    it and the first update; it compares ``--max-update`` only after an update (``validate_and_save``), so a
    finished training started again would train once more and overwrite its checkpoints. ``SystemExit(0)`` is
    what ends it before that: fairseq's loop can only be stopped from inside an epoch, and the ways round it
    (replacing ``fairseq_cli.train.train``, whose import configures the root logger, or a learning rate under
    ``--stop-min-lr``) patch more and still run the dry-run validation. Every rank has read the same update count,
    so every rank of a distributed run ends alike."""

    @functools.wraps(load_checkpoint)
    def resuming_load_checkpoint(self, filename, *args, **kwargs):
        token = _resumed_model_cfg.set(self.cfg.model)
        try:
            with _naming_a_replaced_dictionary_mismatch(filename):
                extra_state = load_checkpoint(self, filename, *args, **kwargs)
        finally:
            _resumed_model_cfg.reset(token)
        if extra_state is not None:
            _end_a_finished_training(self, filename)
        return extra_state

    return resuming_load_checkpoint


def _end_a_finished_training(trainer: Trainer, filename: str) -> None:
    """Exit 0, saying why, when ``trainer`` has done ``--max-update`` updates (``comparing_the_resumed_model``)."""
    finished = finished_training(filename, trainer.get_num_updates(), trainer.cfg.optimization.max_update)
    if finished is not None:
        logger.info(finished)
        raise SystemExit(0)


@contextlib.contextmanager
def _naming_a_replaced_dictionary_mismatch(filename: str):
    """Raise ``DictionaryMismatchError("checkpoint FILENAME: ...")`` for an error raised inside whose
    ``__context__`` is a ``DictionaryMismatchError`` (fairseq's replacement of it); other errors pass unchanged."""
    try:
        yield
    except Exception as error:
        cause = error.__context__
        if isinstance(cause, DictionaryMismatchError) and not isinstance(error, DictionaryMismatchError):
            raise DictionaryMismatchError(f"checkpoint {filename}: {cause}") from error
        raise


def checking_the_arch_of(task: str) -> Callable[[Callable], Callable]:
    """For fairseq's text task ``task``: ``add_args(parser)`` made to refuse, as it is parsed, an ``--arch`` of this
    package that trains with another task (``task_check.check_arch_when_parsed``, ``text_task_arch_error``).

    Why a patch: fairseq turns ``fairseq-train``'s arguments into a config before any task or model code of ours
    runs, and the task's ``add_args`` is the last thing that sees the parser before that (``options.
    parse_args_and_arch`` calls ``TASK_REGISTRY[name].add_args(parser)``); fairseq's own tasks are not ours to
    subclass under their names. Relied on: a static or class method taking the parser; ``--arch`` already added."""

    def wrap(add_args: Callable) -> Callable:
        @functools.wraps(add_args)
        def add_args_checking_arch(parser: argparse.ArgumentParser) -> None:
            add_args(parser)
            check_arch_when_parsed(parser, lambda arch: text_task_arch_error(task, arch))

        return add_args_checking_arch

    return wrap


def patches() -> list[Patch]:
    """Every patch, in the order ``apply`` installs them."""
    return [Patch(checkpoint_utils, "load_checkpoint_to_cpu", checking_every_checkpoint),
            Patch(checkpoint_utils, "load_model_ensemble_and_task", naming_the_checkpoint_of_a_model),
            Patch(Trainer, "load_checkpoint", comparing_the_resumed_model),
            *(Patch(TASK_REGISTRY[task], "add_args", checking_the_arch_of(task))
              for task in checked_text_tasks() if task in TASK_REGISTRY)]


def apply() -> None:
    """Install every patch that is not installed yet (a second call changes nothing)."""
    for patch in patches():
        patch.apply()
