"""One-line errors when a model meets a task of another family (a checkpoint or ``--arch`` of another kind).

Without them fairseq builds the model anyway and fails deep inside a forward pass (a transducer fed text
tokens by ``fairseq-eval-lm``, a language model fed filterbanks by ``fairseq-generate``), or, for ``fairseq-train
--arch``, inside its conversion of the arguments to a config (see ``check_arch_when_parsed``).
"""
import argparse
from typing import Callable

from fairseq.models import ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.tasks import TASK_REGISTRY
from fairseq.tasks.speech_to_text import SpeechToTextTask

# the tasks whose samples are text: a transducer cannot read them
TEXT_TASKS = ("language_modeling", "masked_lm", "translation", "sentence_prediction", "denoising",
              "multilingual_denoising", "translation_multi_simple_epoch")
# the tasks each of this package's models trains with (fairseq's own models are left to fairseq)
MODEL_TASKS = {
    "transducer": ("speech_transducer",),
    "spade_lm": ("language_modeling",),
    "mssm_roberta": ("masked_lm", "sentence_prediction"),
    "spade_transformer": ("translation", "denoising"),
}


def task_name(task) -> str:
    """The registered name of ``task`` (its class name if it is not registered)."""
    return next((name for name, cls in TASK_REGISTRY.items() if type(task) is cls), type(task).__name__)


def is_text_task(task) -> bool:
    return any(isinstance(task, TASK_REGISTRY[name]) for name in TEXT_TASKS if name in TASK_REGISTRY)


def require_speech_task(model: str, task) -> None:
    """A transducer reads filterbanks: refuse the text tasks."""
    if is_text_task(task):
        raise ValueError(f"model {model!r} is a speech transducer and needs --task speech_transducer; "
                         f"got --task {task_name(task)} (a checkpoint or --arch of another model family?)")


def require_text_task(model: str, task, expected: str) -> None:
    """A text model reads token ids from a task with a source dictionary: refuse speech tasks."""
    if isinstance(task, SpeechToTextTask) or getattr(task, "source_dictionary", None) is None:
        raise ValueError(f"model {model!r} needs --task {expected}; got --task {task_name(task)} "
                         f"(a checkpoint or --arch of another model family?)")


SPEECH_TASK_MODELS = ("--task speech_transducer trains and decodes transducer models (--arch mssm_transducer, "
                      "stateformer_transducer, ...)")


def speech_task_arch_error(arch: str | None) -> str | None:
    """Why ``--task speech_transducer`` cannot train or decode ``arch`` (an architecture or model name); None if
    it can."""
    model = ARCH_MODEL_NAME_REGISTRY.get(arch, arch)
    if model == "transducer":
        return None
    return f"{SPEECH_TASK_MODELS}; got --arch {arch} (model {model})"


def text_task_arch_error(task: str, arch: str) -> str | None:
    """Why fairseq's text task ``task`` cannot train ``arch``, one of this package's architectures of another family
    (``--task language_modeling --arch mssm_transducer`` fails inside fairseq's config conversion otherwise); None
    if it can, or if ``arch`` is not this package's."""
    model = ARCH_MODEL_NAME_REGISTRY.get(arch, arch)
    tasks = MODEL_TASKS.get(model)
    if tasks is None or task in tasks:
        return None
    return f"--arch {arch} (model {model}) trains with --task {' or '.join(tasks)}; got --task {task}"


def checked_text_tasks() -> list[str]:
    """fairseq's text tasks that this package's models train with (``MODEL_TASKS``): ``fairseq_patches`` gives their
    ``--arch`` the check of ``check_arch_when_parsed`` with ``text_task_arch_error``."""
    return sorted({task for tasks in MODEL_TASKS.values() for task in tasks} & set(TEXT_TASKS))


def speech_task_option_clash(error: argparse.ArgumentError) -> str:
    """The error for a clash of the speech task's options with the model's, which fairseq adds just before them:
    ``--arch transformer`` defines ``--max-source-positions`` too, and argparse refuses to define it twice."""
    return (f"{SPEECH_TASK_MODELS}; got an --arch that defines {error.argument_name}, an option of the task "
            f"(a model of another family?)")


def check_arch_when_parsed(parser: argparse.ArgumentParser, arch_error: Callable[[str], str | None]) -> None:
    """Make ``parser``'s ``--arch`` refuse, as it is parsed, an architecture for which ``arch_error`` has a message.

    ``fairseq-train`` turns its arguments into a config before any task or model code runs, and resolves there
    the model config's references to task options: ``--arch transformer_lm`` with a task that has no
    ``--tokens-per-sample`` fails inside omegaconf, naming neither the model nor the task. A task's ``add_args``
    runs before fairseq's last parse of the command line, so it can give ``--arch`` a type that checks the name
    and stops the parser with the one line ``<prog>: error: <message>`` (exit status 2, as argparse's errors, but
    without the usage, hundreds of options long in fairseq). Names fairseq does not know are left to argparse's
    own ``invalid choice`` error. The default is not checked: argparse converts it too, and ``fairseq-generate``
    adds an ``--arch`` defaulting to ``wav2vec2`` for fairseq's audio pre-training task (generate builds its model
    from the checkpoint). A parser without ``--arch`` is left as it is.
    """
    for action in parser._actions:  # argparse has no public look-up of an argument
        if action.dest != "arch":
            continue
        convert, default = action.type or str, action.default

        def checked(name: str, convert=convert, default=default) -> str:
            error = arch_error(name) if name != default and name in ARCH_MODEL_REGISTRY else None
            if error is not None:
                parser.exit(2, f"{parser.prog}: error: {error}\n")
            return convert(name)

        action.type = checked
