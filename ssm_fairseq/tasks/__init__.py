"""Tasks registered with fairseq (``--task speech_transducer``)."""
from . import speech_transducer  # noqa: F401
