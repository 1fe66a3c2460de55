"""Tasks registered with fairseq (``--task speech_transducer``). fairseq's text tasks get this package's ``--arch``
check from ``fairseq_patches`` (``models/task_check.py`` says which tasks and what it refuses)."""
from . import speech_transducer  # noqa: F401
