"""The WebSocket protocol of ``ssm-serve``: what a client sends, what it gets back, and the errors that name a bad
message. sherpa-onnx's streaming WebSocket servers speak the same, so their clients work unchanged.

Client -> server:

- binary messages: audio, float32 little-endian samples, 16 kHz, mono, in [-1, 1]; any number of samples per message
  (a whole number of 4-byte samples).
- the text message ``Done``: the utterance has ended; the server sends its final result, then ``Done!``, and
  closes the connection.
- optionally, before any audio, one text message holding a JSON object of settings: ``{"timestamps": true}`` (words
  with their times in the results) and ``{"sample_rate": 16000}`` (the only rate served: the server does not
  resample; a client at another rate resamples before sending, as the web page does).

Server -> client, JSON text messages:

- ``{"text": ..., "segment": i, "start": s, "is_final": false, "final": false}``: the partial transcript of the
  segment in progress whenever it changes (``start``: the segment's start, seconds from the utterance's start);
- ``{"text": ..., "segment": i, "start": s, "end": e, "is_final": true, "final": false[, "words": [...]]}``: a
  segment ended at a pause (an endpoint);
- ``{"text": ..., "segments": [...], "final": true, "is_final": true, "is_eof": true}``: the last message of an
  utterance: its whole transcript (its segments' texts joined by spaces) and its segments, each
  ``{"segment", "start", "end", "text"[, "words"]}``; ``words`` (on request) is ``[[word, start, end], ...]`` in
  seconds rounded to 0.01, as ``ssm-transcribe --timestamps`` prints them;
- ``{"error": message, "code": code}``: a named error (``PROTOCOL_ERRORS``), after which the server closes the
  connection.

``final`` is this protocol's name for the last result; ``is_final``, ``is_eof``, ``segment`` and the closing
``Done!`` are the names sherpa-onnx's servers use, kept so that their clients read the results.
"""
from __future__ import annotations

import json
import math
from typing import Any, Sequence

import numpy as np

SAMPLE_RATE = 16000
END_OF_UTTERANCE = "Done"  # the client's text message ending the utterance
END_OF_RESULTS = "Done!"  # the server's text message after the final result (sherpa-onnx's C++ server's)
SETTINGS = {"timestamps": bool, "sample_rate": int}

# code -> what it means; every error a client can get
PROTOCOL_ERRORS = {
    "bad_audio": "a binary message that is not float32 samples (a byte count not a multiple of 4), or samples that "
                 "are NaN, infinite or beyond [-1, 1]",
    "bad_message": "a text message that is neither Done nor a JSON object of settings",
    "bad_settings": "settings with an unknown key or a value of the wrong type, or sent after audio",
    "unsupported_sample_rate": "a sample_rate other than 16000",
    "idle_timeout": "no message for --idle-timeout seconds",
    "server_error": "the model failed on this stream's audio",
    "too_many_connections": "--max-connections streams are open",
}


class ProtocolError(ValueError):
    """A client's message the server refuses; ``code`` is a key of ``PROTOCOL_ERRORS``."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def samples_of(payload: bytes, received: int) -> np.ndarray:
    """A binary message -> its float32 samples (1-D), checked: ``ProtocolError("bad_audio")`` naming the problem
    and where it is (``received``: the samples of the utterance before this message)."""
    if len(payload) % 4:
        raise ProtocolError("bad_audio", f"a binary message of {len(payload)} bytes is not a whole number of "
                                         f"float32 samples (4 bytes each); the protocol is float32 little-endian "
                                         f"samples at {SAMPLE_RATE} Hz")
    samples = np.frombuffer(payload, dtype="<f4").astype(np.float32)
    finite = np.isfinite(samples)
    if not finite.all():
        first = int(np.argmin(finite))
        raise ProtocolError("bad_audio", f"sample {received + first} is {samples[first]}: samples must be finite")
    if samples.size and np.abs(samples).max() > 1.0:
        peak = int(np.abs(samples).argmax())
        raise ProtocolError("bad_audio", f"sample {received + peak} is {samples[peak]:g}: samples are floats in "
                                         f"[-1, 1] (16-bit values? divide them by 32768)")
    return samples


def settings_of(text: str, audio_received: bool) -> dict[str, Any]:
    """A text message other than ``Done`` -> the settings it holds, checked (``ProtocolError`` otherwise)."""
    try:
        settings = json.loads(text)
    except ValueError:
        settings = None
    if not isinstance(settings, dict):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ProtocolError("bad_message", f"text message {shown!r}: the protocol's text messages are "
                                           f"{END_OF_UTTERANCE!r} (end of utterance) and, before any audio, a JSON "
                                           f"object of settings ({', '.join(SETTINGS)})")
    if audio_received:
        raise ProtocolError("bad_settings", "settings must come before the first audio message")
    for key, value in settings.items():
        kind = SETTINGS.get(key)
        if kind is None:
            raise ProtocolError("bad_settings", f"unknown setting {key!r}; known: {', '.join(SETTINGS)}")
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            raise ProtocolError("bad_settings", f"setting {key!r} must be a {kind.__name__}, got {value!r}")
    rate = settings.get("sample_rate", SAMPLE_RATE)
    if rate != SAMPLE_RATE:
        raise ProtocolError("unsupported_sample_rate", f"sample_rate {rate}: this server takes {SAMPLE_RATE} Hz "
                                                       f"audio only; resample on the client")
    return settings


def _seconds(value: float) -> float:
    return round(value, 2) if math.isfinite(value) else value


def _words(words: Sequence) -> list:
    return [[word, _seconds(start), _seconds(end)] for word, start, end in words]


def partial_message(text: str, segment: int, start: float) -> str:
    """The partial transcript of segment ``segment`` (started ``start`` seconds into the utterance)."""
    return json.dumps({"text": text, "segment": segment, "start": _seconds(start), "is_final": False,
                       "final": False}, ensure_ascii=False)


def segment_fields(index: int, segment, timestamps: bool) -> dict[str, Any]:
    """An ended ``Segment`` as the JSON object results carry."""
    fields = {"segment": index, "start": _seconds(segment.start), "end": _seconds(segment.end), "text": segment.text}
    if timestamps:
        fields["words"] = _words(segment.words)
    return fields


def segment_message(index: int, segment, timestamps: bool) -> str:
    """A segment ended at an endpoint, before the utterance's end."""
    return json.dumps({**segment_fields(index, segment, timestamps), "is_final": True, "final": False},
                      ensure_ascii=False)


def final_message(segments: Sequence, timestamps: bool) -> str:
    """The utterance's last result: its transcript and all its segments."""
    fields = [segment_fields(index, segment, timestamps) for index, segment in enumerate(segments)]
    text = " ".join(segment.text for segment in segments if segment.text)
    return json.dumps({"text": text, "segments": fields, "segment": max(len(fields) - 1, 0), "final": True,
                       "is_final": True, "is_eof": True}, ensure_ascii=False)


def error_message(error: ProtocolError) -> str:
    return json.dumps({"error": str(error), "code": error.code}, ensure_ascii=False)
