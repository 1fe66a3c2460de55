"""What the ``ssm-serve`` tests share: a tiny causal model trained on global CMVN, a server running in the test's event
loop or as the ``ssm-serve`` command, and a client that streams a file and collects what comes back."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from cli import REPO
from test_transcribe import train_tiny

# A blank penalty far above the tiny model's logits' spread makes it emit labels: no transcript compared is empty.
SEARCH = {"beam": 1, "max_symbols_per_frame": 2, "blank_penalty": 20.0}
SEARCH_FLAGS = ["--beam", "1", "--max-symbols-per-frame", "2", "--blank-penalty", "20"]


@dataclass
class StreamingModel:
    checkpoint: Path
    files: list[Path]  # test-mini utterances (flac, 16 kHz)


@pytest.fixture(scope="session")
def streaming_model(tmp_path_factory) -> StreamingModel:
    """A tiny causal model trained for two epochs on 12 utterances prepared with global CMVN, and 4 test files."""
    root = tmp_path_factory.mktemp("serve_model")
    checkpoints = train_tiny(root, 4, "mssm_transducer_streaming", ("--cmvn", "global"))
    return StreamingModel(checkpoints / "checkpoint_last.pt",
                          sorted((root / "LibriSpeech").glob("test-mini/*/*/*.flac")))


@contextlib.asynccontextmanager
async def running(server):
    """``server`` (a ``SpeechServer``) listening on a free port of 127.0.0.1 in this event loop -> its base URL."""
    from aiohttp import web
    runner = web.AppRunner(server.app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@dataclass
class Received:
    """What a connection got: the JSON results in order, the texts that were not JSON, and the close code."""
    results: list[dict] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    close_code: int | None = None

    @property
    def final(self) -> dict:
        finals = [r for r in self.results if r.get("final")]
        assert len(finals) == 1 and self.results[-1] is finals[0], self.results
        return finals[0]

    @property
    def errors(self) -> list[dict]:
        return [r for r in self.results if "error" in r]


async def collect(ws) -> Received:
    """Read a client WebSocket to its close."""
    from aiohttp import WSMsgType
    received = Received()
    async for message in ws:
        if message.type == WSMsgType.TEXT:
            try:
                received.results.append(json.loads(message.data))
            except ValueError:
                received.texts.append(message.data)
    received.close_code = ws.close_code
    return received


async def stream_file(http, url: str, path: Path, chunk: int = 1600, realtime: float = 0.0,
                      settings: dict | None = None) -> Received:
    """Stream ``path`` to ``url`` in ``chunk``-sample binary messages (``realtime``: seconds of pause per second
    of audio; 0: as fast as the socket takes them), then ``Done`` -> what came back. A server that closes the
    connection (after an error message) ends the sending: what it sent until then is returned."""
    from aiohttp.client_exceptions import ClientConnectionResetError
    samples, rate = sf.read(str(path), dtype="float32")
    assert rate == 16000
    async with http.ws_connect(url) as ws:
        reader = asyncio.create_task(collect(ws))
        with contextlib.suppress(ClientConnectionResetError):  # the server closed: its last messages are read
            if settings is not None:
                await ws.send_str(json.dumps(settings))
            for start in range(0, len(samples), chunk):
                await ws.send_bytes(samples[start:start + chunk].astype("<f4").tobytes())
                if realtime:
                    await asyncio.sleep(realtime * chunk / 16000)
            await ws.send_str("Done")
        return await reader


def start_command(checkpoint: Path, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, int]:
    """``python -m ssm_fairseq.cli.serve --checkpoint CK --port 0 --cpu ARGS`` -> (process, port), once it listens
    (its first stdout line, ``{"listening": PORT}``)."""
    process = subprocess.Popen([sys.executable, "-m", "ssm_fairseq.cli.serve", "--checkpoint", str(checkpoint),
                                "--port", "0", "--cpu", *args], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env or dict(os.environ, OMP_NUM_THREADS="1"))
    line = process.stdout.readline()
    if not line:
        process.wait(10)
        raise AssertionError(f"ssm-serve exited {process.returncode}:\n{process.stderr.read()}")
    return process, json.loads(line)["listening"]


def stop_command(process: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    """SIGTERM -> (exit status, stderr)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
        raise AssertionError(f"ssm-serve did not stop within {timeout} s of SIGTERM:\n{stderr}")
    return process.returncode, stderr


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def aligned_windows(heard: np.ndarray, sent: np.ndarray, window: int, first: int = 0) -> list[tuple[float, int]]:
    """Where each ``window`` samples of ``sent`` from sample ``first`` on (those with audio in them) are found in
    ``heard``: for each, the peak of their normalized cross-correlation with ``heard`` and its lag (position in
    ``heard`` minus position in ``sent``); none if ``heard`` is shorter than a window.

    Window by window, so that a block the capture dropped or repeated under load (a real-time glitch of the browser's
    fake device, not of the audio's content) shifts the later windows' lags instead of lowering one global
    correlation."""
    if len(heard) < window:
        return []
    energy = np.concatenate([[0.0], np.cumsum(heard.astype(np.float64) ** 2)])
    size = 1 << (len(heard) + window - 1).bit_length()
    heard_spectrum = np.fft.rfft(heard, size)
    found = []
    for start in range(first, len(sent) - window + 1, window):
        piece = sent[start:start + window].astype(np.float64)
        if np.sqrt(np.mean(piece ** 2)) < 0.01:
            continue  # silence: it matches anything
        product = np.fft.irfft(heard_spectrum * np.conj(np.fft.rfft(piece, size)), size)
        product = product[:len(heard) - window + 1]  # lags at which the window lies wholly inside heard
        scale = np.sqrt(np.maximum(energy[window:] - energy[:-window], 1e-12) * (piece @ piece))
        position = int(np.argmax(product / scale))
        found.append((float(product[position] / scale[position]), position - start))
    return found
