"""All the server's streams stepped as one batch, in one worker thread, so that the model never blocks the event
loop (``StreamStepper``).

The event loop queues each connection's audio in its ``Session``; the stepper's loop waits until some session has
a whole step of audio (``step_samples``, the server's ``--chunk-ms``) or has finished its utterance, takes from
every such session the whole steps it has (all of its audio when finishing), and hands them to its one worker
thread, which steps them together through ``Recognizer.step_streams`` (one encoder batch per step size:
``ssm_fairseq.asr.stream_batch``), ends the finishing streams (``Stream.finish_segments``) and makes each session's
messages; back on the event loop, the messages go to the sessions' outboxes. One thread steps the one model, so
steps never overlap, and the event loop waits for none of them: while a step runs, it receives every client's
audio, which the next step takes (a stream that fell behind steps several chunks at once and catches up).

Every stream's results are those it gets alone: ``step_streams`` gives each stream the partial transcript
``Stream.accept_waveform`` gives, and a stream's final transcript is the one offline decoding gives for its audio
(``ssm_fairseq.asr.stream``). A step that fails (the model computed NaN, ...) ends the sessions stepped in it with
a ``server_error``; the others go on.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..asr.stream_batch import StreamsFailedError
from .protocol import ProtocolError, final_message, partial_message, segment_message
from .session import INTERNAL_ERROR, NORMAL, Session

if TYPE_CHECKING:
    from ..asr.endpoints import EndpointRules
    from ..asr.recognizer import Recognizer

logger = logging.getLogger("ssm_fairseq.serve")


class Work(NamedTuple):
    """What a step does for a session: its audio to step, and whether its utterance ends after it."""
    audio: np.ndarray
    finishing: bool


class StreamStepper:
    """Steps the sessions' streams of ``recognizer`` in batches of whole ``step_samples`` chunks; new streams are
    cut into segments by ``endpoints`` (None: one segment per utterance)."""

    def __init__(self, recognizer: Recognizer, step_samples: int, endpoints: EndpointRules | None = None):
        self.recognizer = recognizer
        self.step_samples = step_samples
        self.endpoints = endpoints
        self.sessions: set[Session] = set()
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ssm-serve-step")
        self.steps = 0  # batches stepped, for the log and the tests

    def add(self, session: Session) -> None:
        self.sessions.add(session)

    def wake(self) -> None:
        """Something changed: a session has new audio, finished, or left."""
        self._wake.set()

    def drop(self, session: Session) -> None:
        """The session's connection is gone: its stream is forgotten (a step running with it ends first)."""
        self.sessions.discard(session)

    def finish(self, session: Session, code: int = NORMAL) -> None:
        """The session's utterance has ended: its final result is due (then ``Done!`` and a close with ``code``)."""
        session.finishing, session.close_code = True, code
        self.wake()

    def _ready(self, session: Session) -> bool:
        return not session.stepping and not session.ended and (
            session.finishing or session.pending_samples >= self.step_samples)

    async def run(self) -> None:
        """Step until cancelled: wait for work, step it in the worker thread, deliver the messages."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                work = {session: Work(session.take_audio(None if session.finishing else self.step_samples),
                                      session.finishing)
                        for session in list(self.sessions) if self._ready(session)}
                if not work:
                    continue
                for session in work:
                    session.stepping = True
                try:
                    results = await loop.run_in_executor(self._executor, self._step, work)
                except Exception as error:  # noqa: BLE001 - a bug here must not stop the stepping of others
                    logger.exception(f"a step of {len(work)} streams failed")
                    failure = ProtocolError("server_error", f"the server failed on this step: {error}")
                    results = {session: ([], failure) for session in work}
                finally:
                    for session in work:
                        session.stepping = False
                self.steps += 1
                for session, (messages, error) in results.items():
                    self._deliver(session, messages, error, work[session].finishing)
                self._wake.set()  # audio that came meanwhile may make another step
        finally:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def _deliver(self, session: Session, messages: list[str], error: ProtocolError | None, finished: bool) -> None:
        """The messages of a session's step to its outbox; the end of the connection after its final result or an
        error. (A session that finished while its step ran gets its final result from the next step.)"""
        session.send(*messages)
        if error is not None:
            session.end(INTERNAL_ERROR, error)
            self.drop(session)
        elif finished:
            session.end(session.close_code, results_done=True)
            self.drop(session)

    def _step(self, work: dict[Session, Work]) -> dict[Session, tuple[list[str], ProtocolError | None]]:
        """In the worker thread: every session's audio through the model as one batch, then the finishing streams
        ended -> each session's messages, and its error if its stream failed."""
        for session, task in work.items():
            if session.stream is None and len(task.audio):
                session.stream = self.recognizer.stream(session.timestamps, self.endpoints)
        chunks = {session.stream: task.audio for session, task in work.items() if len(task.audio)}
        try:
            partials = self.recognizer.step_streams(chunks) if chunks else {}
        except StreamsFailedError as failed:  # streams whose features were not finite fail alone; the others go on
            bad = {stream: ProtocolError("bad_audio", f"the features of this stream are not finite: {error}")
                   for stream, error in failed.errors.items()}
            return {session: (([], bad[session.stream]) if session.stream in bad
                              else self._messages(session, failed.partials.get(session.stream), task.finishing))
                    for session, task in work.items()}
        except Exception as error:  # noqa: BLE001 - the model's failure on these streams, named to their clients
            logger.exception(f"a step of {len(chunks)} streams failed")
            failure = ProtocolError("server_error", f"the model failed on this step: {error}")
            return {session: ([], failure) for session in work}
        return {session: self._messages(session, partials.get(session.stream), task.finishing)
                for session, task in work.items()}

    def _messages(self, session: Session, partial: str | None, finishing: bool
                  ) -> tuple[list[str], ProtocolError | None]:
        """The session's messages after its step: segments ended at endpoints, then the partial transcript if it
        changed, or the final result when finishing."""
        stream = session.stream
        ended = stream.segments[session.segments_sent:] if stream is not None else []
        messages = [segment_message(session.segments_sent + i, segment, session.timestamps)
                    for i, segment in enumerate(ended)]
        session.segments_sent += len(ended)
        if finishing:
            try:
                segments = stream.finish_segments() if stream is not None else []
            except Exception as error:  # noqa: BLE001 - as in _step
                logger.exception(f"{session.name}: finishing the stream failed")
                return messages, ProtocolError("server_error", f"the model failed on this stream: {error}")
            return messages + [final_message(segments, session.timestamps)], None
        if partial is not None and (partial != session.shown or ended):
            messages.append(partial_message(partial, len(stream.segments),
                                            stream.segment_start * self.recognizer.frame_seconds))
            session.shown = partial
        return messages, None
