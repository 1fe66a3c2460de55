"""Tasks registered with fairseq (``--task speech_transducer``), and the ``--arch`` check of fairseq's text tasks
for this package's models (``models/task_check.py``)."""
from ..models.task_check import check_text_tasks_arch
from . import speech_transducer  # noqa: F401

check_text_tasks_arch()
