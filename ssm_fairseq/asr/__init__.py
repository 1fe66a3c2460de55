"""Speech recognition: the transducer, from features to transcripts.

Subpackages: ``features`` (filterbanks of files and of streams, the data directory's feature transforms),
``encoder`` (the speech encoder and its sub-samplers; torch only), ``transducer`` (predictor, joiner, losses, and the
fairseq model, criterion and task), ``search`` (greedy and beam search, LM fusion, word timestamps; what
``fairseq-generate`` runs).

Recognition with a trained checkpoint: one ``Recognizer`` (``recognizer``) loads the model, dictionary, feature
transforms, search and optional LM once, and serves batched offline transcription of files (``offline``; files
longer than one window go window by window through ``long_form``, cut where ``windowing`` says) and any
number of live streams (``stream``: ``Recognizer.stream()``, one ``Stream`` per source; ``stream_batch``: many
streams' encoders stepped as one batch, ``Recognizer.step_streams``); ``streaming_transcriber`` is a one-stream
convenience. ``options`` holds the decoding settings (``DecodingOptions``), ``checkpoint`` the loading and checking of
a ``speech_transducer`` checkpoint and its data directory, ``samples`` the checks on streamed samples and chunk
sizes, ``endpoints`` the rules that cut a stream into segments, ``transcripts`` what comes out (``TimedTranscript``,
``Segment``, ``InputError``) and ``segment_formats`` how it is written (text, tsv, json, srt, vtt). The command line
is ``ssm_fairseq.cli.transcribe`` (``ssm-transcribe``); ``options``, ``endpoints``, ``transcripts`` and
``segment_formats`` import no torch, so that it parses its arguments and writes its outputs without.

``Recognizer``, ``Stream`` and ``transcribe`` are importable from here; they are imported on first use, so that the
torch-only subpackages (``encoder``, the transducer's parts) import without fairseq.
"""
import importlib

_EXPORTED = {"Recognizer": "recognizer", "transcribe": "recognizer", "Stream": "stream"}

__all__ = sorted(_EXPORTED)


def __getattr__(name: str):
    """``Recognizer``, ``Stream`` and ``transcribe``, imported on first use (PEP 562)."""
    if name not in _EXPORTED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTED[name]}"), name)
