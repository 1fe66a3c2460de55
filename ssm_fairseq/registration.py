"""Registering the package's fairseq components when fairseq is imported, so that the torch-only parts never import it.

The registering modules (``REGISTERING``: the transducer's criterion, model and task, the text models, the LR
scheduler) and ``fairseq_patches``
(the fairseq functions the package replaces, applied by ``register()``) import fairseq, which costs seconds;
``ssm_fairseq.ssm`` and ``ssm_fairseq.layers`` need torch only. Python runs ``ssm_fairseq/__init__.py`` before any
submodule, so the package cannot import them eagerly. ``arm()``, called by
``__init__``, registers at once when fairseq is already imported (``fairseq-train --user-dir``, ``import fairseq``
first), and otherwise puts ``_RegisterWithFairseq`` at the front of ``sys.meta_path``: it lets the other finders find
each module and, through a one-shot wrapper of its loader's ``exec_module``, learns when the top-level ``fairseq``
module has finished executing (fairseq's ``__init__`` fills its registries) and when this package's own submodules
start and finish executing. Registration runs as soon as fairseq is complete and none of this package's modules is
half-executed: inside ``import fairseq`` when that is what imported it, or at the end of the outermost of our modules
whose import imported fairseq (``from ssm_fairseq.transcribe import ...``, every ``ssm-*`` command). Registering in
the middle of such a module would import it again half-executed (``asr.transducer.task`` importing
``checkpoint_checks`` while
``checkpoint_checks`` imports fairseq: a circular-import error). Either way registration is complete before the
import statement that loaded fairseq returns, so nothing that reads fairseq's registries can run before it.

If a finder placed before ours in ``sys.meta_path`` loads fairseq itself, no wrapper is seen and nothing registers;
fairseq then names the unknown task or architecture, and ``register()`` (idempotent) registers by hand.
"""
from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Callable, Sequence

PACKAGE = __name__.rpartition(".")[0]
REGISTERING = ("asr.transducer.criterion", "asr.transducer.model", "text", "optim", "asr.transducer.task",
               "asr.features.adaptive_cmvn")
PATCHES = "fairseq_patches"


def register() -> None:
    """Import the subpackages that register components with fairseq (each import happens once), then apply the
    package's patches of fairseq (``fairseq_patches.apply``, idempotent)."""
    for name in REGISTERING:
        importlib.import_module(f"{PACKAGE}.{name}")
    importlib.import_module(f"{PACKAGE}.{PATCHES}").apply()


def fairseq_imported() -> bool:
    """Whether fairseq's top-level module has been imported and finished executing."""
    fairseq = sys.modules.get("fairseq")
    return fairseq is not None and not getattr(fairseq.__spec__, "_initializing", False)


def arm() -> None:
    """Register now if fairseq is imported, else as soon as it is (``_RegisterWithFairseq``); once per process."""
    if fairseq_imported():
        register()
    elif not any(type(finder).__name__ == _RegisterWithFairseq.__name__ for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterWithFairseq())


ExecModule = Callable[[ModuleType], None]


class _RegisterWithFairseq(importlib.abc.MetaPathFinder):
    """A finder that finds nothing itself: it wraps the loaders of ``fairseq`` and of this package's submodules to
    register once fairseq has executed and no submodule of ours is executing (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executing = 0  # our submodules whose code is running, in any thread
        self._fairseq_ready = False
        self._registered = False

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if name != "fairseq" and not name.startswith(f"{PACKAGE}."):
            return None
        spec = self._spec_from_other_finders(name, path, target)
        if spec is not None and callable(getattr(spec.loader, "exec_module", None)):
            self._wrap(spec.loader, self._fairseq_executed if name == "fairseq" else self._ours_executed)
        return spec

    def _spec_from_other_finders(self, name: str, path: Sequence[str] | None,
                                 target: ModuleType | None) -> ModuleSpec | None:
        """The spec the import system would find without this finder."""
        for finder in list(sys.meta_path):
            find_spec = getattr(finder, "find_spec", None)
            if finder is not self and find_spec is not None:
                spec = find_spec(name, path, target)
                if spec is not None:
                    return spec
        return None

    @staticmethod
    def _wrap(loader: importlib.abc.Loader, around: Callable[[ExecModule, ModuleType], None]) -> None:
        """Make this loader's next ``exec_module(module)`` call ``around(original exec_module, module)``; the
        loader is its own class again afterwards (one loader per module: ``FileFinder`` makes a new one per spec)."""
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            loader.__dict__.pop("exec_module", None)
            around(original, module)

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):  # a loader without an instance __dict__: see the module docstring
            pass

    def _fairseq_executed(self, exec_module: ExecModule, module: ModuleType) -> None:
        exec_module(module)
        with self._lock:
            self._fairseq_ready = True
        self._register_if_due()

    def _ours_executed(self, exec_module: ExecModule, module: ModuleType) -> None:
        with self._lock:
            self._executing += 1
        try:
            exec_module(module)
        finally:
            with self._lock:
                self._executing -= 1
        self._register_if_due()

    def _register_if_due(self) -> None:
        """Register once fairseq is ready and none of our submodules is executing; a failure propagates and the
        next of our imports tries again."""
        with self._lock:
            due = self._fairseq_ready and self._executing == 0 and not self._registered
            self._registered = self._registered or due
        if not due:
            return
        try:
            register()
        except BaseException:
            with self._lock:
                self._registered = False
            raise
        if self in sys.meta_path:
            sys.meta_path.remove(self)
