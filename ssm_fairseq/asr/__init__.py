"""Speech recognition with a trained transducer checkpoint: one ``Recognizer`` (``recognizer``) loads the model,
dictionary, feature transforms, search and optional LM once, and serves batched offline transcription of files
(``offline``) and any number of live streams (``stream``: ``Recognizer.stream()``, one ``Stream`` per source).

``options`` holds the decoding settings (``DecodingOptions``), ``checkpoint`` the loading and checking of a
``speech_transducer`` checkpoint and its data directory, ``samples`` the checks on streamed samples and chunk sizes,
``transcripts`` what comes out (``TimedTranscript``, ``InputError``). The command line is ``ssm_fairseq.cli.transcribe``
(``ssm-transcribe``).
"""
from .recognizer import Recognizer, transcribe
from .stream import Stream

__all__ = ["Recognizer", "Stream", "transcribe"]
