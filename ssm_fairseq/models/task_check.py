"""One-line errors when a model meets a task of another family (a checkpoint or ``--arch`` of another kind).

Without them fairseq builds the model anyway and fails deep inside a forward pass (a transducer fed text
tokens by ``fairseq-eval-lm``, a language model fed filterbanks by ``fairseq-generate``).
"""
from fairseq.tasks import TASK_REGISTRY
from fairseq.tasks.speech_to_text import SpeechToTextTask

# the tasks whose samples are text: a transducer cannot read them
TEXT_TASKS = ("language_modeling", "masked_lm", "translation", "sentence_prediction", "denoising",
              "multilingual_denoising", "translation_multi_simple_epoch")


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
