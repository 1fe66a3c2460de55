"""The fairseq functions ``ssm_fairseq.fairseq_patches`` replaces still are what the patches expect of them.

Each guard test checks fairseq's original function (``Patch.original``: the wrapper's ``__wrapped__``): the
parameters the wrapper passes through or reads (names and kinds), what it returns and raises, and that fairseq's
own callers reach it through the attribute the patch replaces; a fairseq upgrade that changes any of them fails
here, naming the function. The fairseq objects come from one tiny ``transformer_lm`` trained on nothing (a
``language_modeling`` task over a five-word dictionary) and its ``Trainer``.
"""
from __future__ import annotations

import argparse
import inspect
from pathlib import Path
from typing import Callable

import pytest
import torch
from fairseq import checkpoint_utils, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.tasks import TASK_REGISTRY
from fairseq.trainer import Trainer

from ssm_fairseq import fairseq_patches
from ssm_fairseq.integrity.checkpoint_checks import is_unreadable_file_error
from ssm_fairseq.integrity.checkpoint_errors import DictionaryMismatchError
from ssm_fairseq.fairseq_patches import PATCH_MARK, Patch, patches

from test_package import run_in_repo

POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
TINY_LM = ["--task", "language_modeling", "--arch", "transformer_lm", "--decoder-layers", "1",
           "--decoder-embed-dim", "8", "--decoder-ffn-embed-dim", "16", "--decoder-attention-heads", "2",
           "--tokens-per-sample", "16", "--optimizer", "adam", "--lr", "1e-3", "--max-update", "3", "--cpu"]


def patch_of(owner, name: str) -> Patch:
    """The patch of ``owner.name``."""
    return next(p for p in patches() if p.owner is owner and p.name == name)


def assert_parameters(function: Callable, expected: dict[str, inspect._ParameterKind]) -> None:
    """``function``'s first parameters are ``expected`` (names and kinds, in order), or an error naming it."""
    parameters = list(inspect.signature(function).parameters.values())[:len(expected)]
    found = {p.name: p.kind for p in parameters}
    assert found == expected, (f"fairseq's {function.__module__}.{function.__qualname__} changed its parameters: "
                               f"{inspect.signature(function)}; fairseq_patches expects {list(expected)} first")


def assert_calls_through(caller: Callable, *names: str) -> None:
    """``caller``'s code looks up each of ``names`` as a global or attribute (so that it finds a patch installed
    there), or an error naming both."""
    missing = [name for name in names if name not in caller.__code__.co_names]
    assert not missing, (f"fairseq's {caller.__module__}.{caller.__qualname__} no longer calls {', '.join(missing)}: "
                         f"the patch of it is not reached")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Trainer, Path]:
    """A ``Trainer`` of a tiny ``transformer_lm`` and ``checkpoint_last.pt`` it saved after 3 updates (counted, not
    trained) with the extra state ``{"note": 1}``."""
    root = tmp_path_factory.mktemp("fairseq_patches")
    (root / "dict.txt").write_text("".join(f"{word} 1\n" for word in ("a", "b", "c", "d", "e")))
    args = options.parse_args_and_arch(options.get_training_parser(), [str(root), *TINY_LM])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    trainer.set_num_updates(3)
    trainer.consolidate_optimizer()  # as fairseq's checkpoint_utils.save_checkpoint does before saving
    trainer.save_checkpoint(str(root / "checkpoint_last.pt"), {"note": 1})
    return trainer, root / "checkpoint_last.pt"


def test_load_checkpoint_to_cpu_takes_a_path_and_returns_model_and_cfg(trained, tmp_path):
    original = patch_of(checkpoint_utils, "load_checkpoint_to_cpu").original()
    assert_parameters(original, {"path": POSITIONAL, "arg_overrides": POSITIONAL, "load_on_all_ranks": POSITIONAL})
    state = original(str(trained[1]), load_on_all_ranks=False)
    assert isinstance(state, dict) and {"model", "cfg"} <= state.keys()
    assert all(torch.is_tensor(value) for value in state["model"].values())
    assert state["cfg"]["model"]._name == "transformer_lm"
    cut = tmp_path / "cut.pt"
    cut.write_bytes(trained[1].read_bytes()[:1000])
    with pytest.raises(Exception) as error:
        original(str(cut))
    assert is_unreadable_file_error(error.value), f"torch.load's error on a truncated file changed: {error.value!r}"


def test_fairseq_reads_checkpoints_through_the_patched_load_checkpoint_to_cpu():
    assert_calls_through(patch_of(Trainer, "load_checkpoint").original(), "checkpoint_utils", "load_checkpoint_to_cpu")
    assert_calls_through(patch_of(checkpoint_utils, "load_model_ensemble_and_task").original(),
                         "load_checkpoint_to_cpu")
    assert_calls_through(checkpoint_utils.load_model_ensemble, "load_model_ensemble_and_task")


def test_load_model_ensemble_and_task_returns_models_cfg_and_task(trained, monkeypatch):
    original = patch_of(checkpoint_utils, "load_model_ensemble_and_task").original()
    assert_parameters(original, {"filenames": POSITIONAL, "arg_overrides": POSITIONAL, "task": POSITIONAL})
    models, cfg, task = original([str(trained[1])])
    assert len(models) == 1 and isinstance(models[0], torch.nn.Module) and cfg.model._name == "transformer_lm"
    assert isinstance(task, TASK_REGISTRY["language_modeling"])

    def mismatch(*args, **kwargs):
        raise DictionaryMismatchError("another dictionary")

    monkeypatch.setattr(TASK_REGISTRY["language_modeling"], "build_model", mismatch)
    with pytest.raises(DictionaryMismatchError, match="^another dictionary$"):  # the task's error, unchanged
        original([str(trained[1])])


def test_trainer_load_checkpoint_returns_the_extra_state_and_keeps_what_the_patch_reads(trained, tmp_path):
    trainer, checkpoint = trained
    original = patch_of(Trainer, "load_checkpoint").original()
    assert_parameters(original, {"self": POSITIONAL, "filename": POSITIONAL})
    assert original(trainer, str(tmp_path / "absent.pt")) is None
    trainer.set_num_updates(0)
    extra_state = original(trainer, str(checkpoint))
    assert isinstance(extra_state, dict) and extra_state["note"] == 1
    assert trainer.get_num_updates() == 3  # what --max-update is compared with
    assert trainer.cfg.optimization.max_update == 3 and trainer.cfg.model._name == "transformer_lm"


def test_trainer_load_checkpoint_replaces_a_weight_error_keeping_it_as_context(trained, monkeypatch):
    """fairseq raises "please ensure that the architectures match" from inside its handler of the model's error;
    the patch finds a ``DictionaryMismatchError`` there (``__context__``)."""
    trainer, checkpoint = trained
    cause = DictionaryMismatchError("another dictionary")

    def mismatch(*args, **kwargs):
        raise cause

    monkeypatch.setattr(trainer.model, "load_state_dict", mismatch)
    with pytest.raises(Exception) as error:
        patch_of(Trainer, "load_checkpoint").original()(trainer, str(checkpoint))
    assert error.value.__context__ is cause


@pytest.mark.parametrize("task", [p.owner for p in patches() if p.name == "add_args"], ids=lambda t: t.__name__)
def test_text_tasks_add_args_takes_the_parser(task):
    original = patch_of(task, "add_args").original()
    kind = type(inspect.getattr_static(next(c for c in task.__mro__[1:] if "add_args" in vars(c)), "add_args"))
    assert kind in (staticmethod, classmethod), f"fairseq's {task.__name__}.add_args is a {kind.__name__} now"
    assert_parameters(original, {"parser": POSITIONAL})
    parser = argparse.ArgumentParser()
    assert original(parser) is None and len(parser._actions) > 1  # options added to the parser given


def test_fairseq_adds_task_options_through_the_registry_after_arch():
    assert_calls_through(options.parse_args_and_arch, "TASK_REGISTRY", "add_args")
    assert any(action.dest == "arch" for action in options.get_training_parser()._actions)


def installed_layers(patch: Patch) -> int:
    """How many of this package's wrappers ``patch.owner.name`` goes through."""
    function, layers = patch.installed(), 0
    while function is not None:
        layers += bool(getattr(function, PATCH_MARK, False))
        function = getattr(function, "__wrapped__", None)
    return layers


def test_applying_twice_wraps_once():
    before = [p.installed() for p in patches()]
    fairseq_patches.apply()
    fairseq_patches.apply()
    assert [p.installed() for p in patches()] == before
    assert [installed_layers(p) for p in patches()] == [1] * len(before)


def test_importing_the_package_installs_each_patch_once():
    result = run_in_repo("""
        import sys
        import ssm_fairseq, fairseq.models
        sys.path.insert(0, "tests")
        from test_fairseq_patches import installed_layers, patches
        print([installed_layers(patch) for patch in patches()])
        """)
    assert result.stdout.split("\n")[-2] == str([1] * len(patches())), result.stdout


def test_a_changed_signature_fails_naming_the_function():
    """What a fairseq upgrade that renamed a parameter would do to the guards above."""
    def load_checkpoint_to_cpu(filename, arg_overrides=None, load_on_all_ranks=False):
        """A fairseq whose first parameter is no longer ``path``."""

    with pytest.raises(AssertionError, match=r"load_checkpoint_to_cpu changed its parameters.*expects \['path'"):
        assert_parameters(load_checkpoint_to_cpu, {"path": POSITIONAL, "arg_overrides": POSITIONAL})
