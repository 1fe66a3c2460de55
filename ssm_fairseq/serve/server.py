"""The HTTP and WebSocket server of ``ssm-serve`` (aiohttp): one loaded ``Recognizer``, one ``Stream`` per connection,
all streams stepped together (``ssm_fairseq.serve.stepper``).

    GET /          the microphone page (``ssm_fairseq/serve/static/``); a WebSocket upgrade here is served as /asr,
                   for sherpa-onnx's clients, which connect to ws://HOST:PORT
    GET /asr       the WebSocket of the protocol (``ssm_fairseq.serve.protocol``)
    GET /health    200 and ``{"status": "ok", "streams": N}``
    GET /static/…  the page's scripts

``serve(...)`` runs until SIGINT or SIGTERM, then shuts down gracefully: no new connection is accepted, every open
utterance gets its final result for the audio received so far (then ``Done!`` and a close with 1001, going away),
and the process exits 0. A client that sends nothing for ``idle_timeout`` seconds gets an ``idle_timeout`` error;
a bad message gets its named error (``protocol.PROTOCOL_ERRORS``) and the connection closes; a client that
disconnects mid-utterance is forgotten. None of these affects the other connections.
"""
from __future__ import annotations

import asyncio
import json
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import soundfile as sf
from aiohttp import WSMsgType, web

from .protocol import END_OF_UTTERANCE, SAMPLE_RATE, ProtocolError, samples_of, settings_of
from .session import CLOSE, GOING_AWAY, POLICY_VIOLATION, TRY_AGAIN_LATER, Session
from .stepper import StreamStepper

if TYPE_CHECKING:
    from ..asr.endpoints import EndpointRules
    from ..asr.recognizer import Recognizer

logger = logging.getLogger("ssm_fairseq.serve")

STATIC = Path(__file__).parent / "static"
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # 65 s of float32 audio in one message
MAX_PENDING_SECONDS = 30.0  # audio a connection may have waiting before the server stops reading it
SHUTDOWN_SECONDS = 30.0  # the longest a graceful shutdown waits for the final results


class SpeechServer:
    """The aiohttp application around one ``StreamStepper``. ``step_ms``: audio per step of a stream;
    ``idle_timeout``: seconds without a message before a connection is closed; ``max_connections``: open
    connections at most (more get ``too_many_connections``); ``save_audio``: a directory to write each
    connection's audio to, as received (``N.wav``, float32 16 kHz, N: the connection's number in the log), when it
    closes."""

    def __init__(self, recognizer: Recognizer, step_ms: float = 160.0, endpoints: EndpointRules | None = None,
                 idle_timeout: float = 20.0, max_connections: int = 64, save_audio: Path | None = None):
        self.save_audio = save_audio
        self.recognizer = recognizer
        self.stepper = StreamStepper(recognizer, round(step_ms * 16), endpoints)
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.connections: set[Session] = set()
        self.stopping = False
        self.app = web.Application()
        self.app.add_routes([web.get("/", self.index), web.get("/asr", self.websocket),
                             web.get("/health", self.health), web.static("/static", STATIC)])
        self.app.cleanup_ctx.append(self._stepping)
        self.app.on_response_prepare.append(self._revalidated)

    async def _stepping(self, app: web.Application):
        task = asyncio.create_task(self.stepper.run(), name="ssm-serve stepper")
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    @staticmethod
    async def _revalidated(request: web.Request, response: web.StreamResponse) -> None:
        """The page and its scripts are revalidated on every load: a browser never runs a stale worklet."""
        if isinstance(response, web.FileResponse):
            response.headers["Cache-Control"] = "no-cache"

    async def index(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self.websocket(request)
        return web.FileResponse(STATIC / "index.html")

    async def health(self, request: web.Request) -> web.Response:
        status = "stopping" if self.stopping else "ok"
        return web.json_response({"status": status, "streams": len(self.connections)},
                                 status=503 if self.stopping else 200)

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES)
        await ws.prepare(request)
        session = Session(request.remote or "?", keep_audio=self.save_audio is not None)
        sender = asyncio.create_task(self._send(ws, session))
        if self.stopping or len(self.connections) >= self.max_connections:
            session.end(TRY_AGAIN_LATER, ProtocolError(
                "too_many_connections", "the server is shutting down" if self.stopping else
                f"the server has {len(self.connections)} connections open, its most (--max-connections)"))
            await sender
            return ws
        self.connections.add(session)
        self.stepper.add(session)
        logger.info(f"{session.name}: open ({len(self.connections)} connections)")
        try:
            await self._receive(ws, session)
        except ProtocolError as error:
            logger.info(f"{session.name}: {error.code}: {error}")
            session.end(POLICY_VIOLATION, error)
        finally:
            if not session.finishing:  # disconnected or refused: nothing more to step
                self.stepper.drop(session)
                session.end()
            await sender
            self.stepper.drop(session)
            self.connections.discard(session)
            logger.info(f"{session.name}: closed ({len(self.connections)} connections)")
            if self.save_audio is not None:
                self._save(session)
        return ws

    def _save(self, session: Session) -> None:
        """The session's audio as received -> ``save_audio/N.wav`` (float32, 16 kHz)."""
        path = self.save_audio / f"{session.number}.wav"
        audio = np.concatenate(session.heard) if session.heard else np.zeros(0, np.float32)
        sf.write(path, audio, SAMPLE_RATE, subtype="FLOAT")
        logger.info(f"{session.name}: {len(audio) / SAMPLE_RATE:.2f} s of audio -> {path}")

    async def _receive(self, ws: web.WebSocketResponse, session: Session) -> None:
        """Read the client's messages until ``Done`` (then the stepper finishes the utterance) or the connection
        closes; ``ProtocolError`` for a bad message or an idle client."""
        while not session.ended:
            if session.pending_samples > MAX_PENDING_SECONDS * 16000:
                await session.drained.wait()  # the client is ahead of the model: stop reading until it catches up
                continue
            try:
                message = await ws.receive(timeout=self.idle_timeout)
            except asyncio.TimeoutError:
                raise ProtocolError("idle_timeout", f"no message for {self.idle_timeout:g} s") from None
            if message.type == WSMsgType.BINARY:
                session.add_audio(samples_of(message.data, session.received))
                self.stepper.wake()
            elif message.type == WSMsgType.TEXT and message.data == END_OF_UTTERANCE:
                self.stepper.finish(session)
                return
            elif message.type == WSMsgType.TEXT:
                settings = settings_of(message.data, session.received > 0)
                session.timestamps = settings.get("timestamps", session.timestamps)
                if session.timestamps:
                    try:
                        self.recognizer.check_timestamps()
                    except ValueError as error:
                        raise ProtocolError("bad_settings", str(error)) from None
            else:  # CLOSE, CLOSING, CLOSED, ERROR: the client has gone
                return

    @staticmethod
    async def _send(ws: web.WebSocketResponse, session: Session) -> None:
        """Send the session's outbox in order until ``CLOSE``, then close the connection. A client gone meanwhile
        gets nothing more; the outbox is still read to its end."""
        while True:
            message = await session.outbox.get()
            if message is CLOSE:
                break
            if not ws.closed:
                try:
                    await ws.send_str(message)
                except (ConnectionError, RuntimeError):  # the transport closed under the send
                    pass
        await ws.close(code=session.close_code)

    async def shut_down(self) -> None:
        """Graceful shutdown: every open utterance finished (its final result for the audio received so far), then
        closed with 1001 (going away); waits for them at most ``SHUTDOWN_SECONDS``."""
        self.stopping = True
        for session in list(self.connections):
            if not session.ended and not session.finishing:
                self.stepper.finish(session, GOING_AWAY)
        deadline = asyncio.get_running_loop().time() + SHUTDOWN_SECONDS
        while self.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for session in list(self.connections):  # past the deadline: closed without a final result
            session.end(GOING_AWAY)


async def serve(server: SpeechServer, host: str, port: int, on_ready: Callable[[int], None] | None = None) -> None:
    """Run ``server`` on ``host:port`` until SIGINT or SIGTERM, then shut it down gracefully. ``on_ready(port)``
    is called once it listens (``port`` 0 picks a free port, which ``on_ready`` is given)."""
    runner = web.AppRunner(server.app, handle_signals=False, shutdown_timeout=SHUTDOWN_SECONDS)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    logger.info(f"serving on http://{host}:{bound}/ (WebSocket ws://{host}:{bound}/asr)")
    if on_ready is not None:
        on_ready(bound)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
        logger.info(f"shutting down: finishing {len(server.connections)} open streams")
        await server.shut_down()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await runner.cleanup()
    logger.info("stopped")


def ready_line(port: int) -> str:
    """The line ``ssm-serve`` prints on stdout once it listens (tests and scripts wait for it)."""
    return json.dumps({"listening": port})
