"""One WebSocket connection's side of the server: its stream, the audio waiting to be stepped, and the messages
waiting to be sent (``Session``). The event loop's thread changes a session; the stepping thread reads the audio
handed to it and the stream (``ssm_fairseq.serve.stepper``).
"""
from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING

import numpy as np

from .protocol import END_OF_RESULTS, ProtocolError, error_message

if TYPE_CHECKING:
    from ..asr.stream import Stream

CLOSE = object()  # the outbox's last item: close the connection (with ``Session.close_code``)

# WebSocket close codes (RFC 6455)
NORMAL, GOING_AWAY, POLICY_VIOLATION, INTERNAL_ERROR, TRY_AGAIN_LATER = 1000, 1001, 1008, 1011, 1013

_numbers = itertools.count(1)


class Session:
    """A connection's state. ``stream``: made at the first audio (``open_stream``, after the settings);
    ``pending``: the samples received and not yet stepped; ``finishing``: the client sent ``Done`` (or the server
    is shutting down), the final result is due; ``outbox``: the messages for the connection's sender, in order,
    ending with ``CLOSE``."""

    def __init__(self, peer: str, keep_audio: bool = False):
        self.number = next(_numbers)
        self.name = f"connection {self.number} ({peer})"
        self.heard: list[np.ndarray] | None = [] if keep_audio else None  # every sample received, if kept
        self.stream: Stream | None = None
        self.timestamps = False
        self.pending: list[np.ndarray] = []
        self.pending_samples = 0
        self.received = 0  # samples of the utterance received
        self.finishing = False
        self.stepping = False  # handed to the stepping thread, not yet back
        self.ended = False  # CLOSE is in the outbox: nothing more is sent
        self.close_code = NORMAL
        self.shown = ""  # the partial transcript last sent
        self.segments_sent = 0  # segments ended at endpoints already sent
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.drained = asyncio.Event()  # set whenever the stepper has taken the pending audio
        self.drained.set()

    def add_audio(self, samples: np.ndarray) -> None:
        """Samples received (checked by ``protocol.samples_of``), waiting for the stepper."""
        if samples.size:
            self.pending.append(samples)
            self.pending_samples += samples.size
            self.received += samples.size
            self.drained.clear()
            if self.heard is not None:
                self.heard.append(samples)

    def take_audio(self, multiple: int | None) -> np.ndarray:
        """The pending samples the stepper takes now, removed: all of them (``multiple`` None), or the most that are
        a whole number of ``multiple`` samples."""
        if not self.pending:
            return np.zeros(0, np.float32)
        audio = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
        take = len(audio) if multiple is None else len(audio) // multiple * multiple
        taken, rest = audio[:take], audio[take:]
        self.pending = [rest] if len(rest) else []
        self.pending_samples = len(rest)
        if not self.pending:
            self.drained.set()
        return taken

    def send(self, *messages: str) -> None:
        """Queue text messages for the client (dropped once the session has ended)."""
        if not self.ended:
            for message in messages:
                self.outbox.put_nowait(message)

    def end(self, code: int = NORMAL, error: ProtocolError | None = None, results_done: bool = False) -> None:
        """Queue the end of the connection: the error message if any, ``Done!`` after a final result
        (``results_done``), then the close with ``code``. Later calls do nothing."""
        if self.ended:
            return
        if error is not None:
            self.send(error_message(error))
        if results_done:
            self.send(END_OF_RESULTS)
        self.ended, self.close_code = True, code
        self.outbox.put_nowait(CLOSE)
        self.drained.set()  # a receive loop waiting for the stepper goes on, and finds the session ended
