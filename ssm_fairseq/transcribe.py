"""The earlier home of transcription, kept for one release: re-exports of ``ssm_fairseq.asr`` and
``ssm_fairseq.cli.transcribe``, so ``from ssm_fairseq.transcribe import Transcriber, transcribe`` and
``python -m ssm_fairseq.transcribe`` keep working (CHANGELOG).

``Transcriber`` is ``ssm_fairseq.asr.Recognizer`` (load once; ``transcribe(paths)`` decodes files in batches,
``stream()`` opens a live stream); ``transcribe(paths, checkpoint, **options)`` loads one and decodes; ``main`` is
``ssm-transcribe``'s.
"""
import sys

from .asr.checkpoint import load_checkpoint
from .asr.features.transforms import PER_FRAME_TRANSFORMS
from .asr.options import DEFAULT_MAX_TOKENS, PRECISIONS
from .asr.recognizer import Recognizer, transcribe
from .asr.transcripts import InputError, TimedTranscript, timed_words_json
from .cli.transcribe import main

Transcriber = Recognizer

__all__ = ["Transcriber", "Recognizer", "transcribe", "TimedTranscript", "InputError", "timed_words_json",
           "load_checkpoint", "PRECISIONS", "DEFAULT_MAX_TOKENS", "PER_FRAME_TRANSFORMS", "main"]

if __name__ == "__main__":
    sys.exit(main())
