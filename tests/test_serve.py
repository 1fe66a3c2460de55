"""ssm-serve: many clients through one loaded model, stepped together, each getting the transcript offline decoding
gives; sherpa-onnx's protocol; bad messages, idle and vanished clients named or forgotten while the others go on;
nothing kept after a connection; graceful shutdown of the command.

A tiny causal model (``serve_cases.streaming_model``) is served in the test's event loop (``SpeechServer``), or as
the ``ssm-serve`` command where the process matters (signals, exit status).
"""
from __future__ import annotations

import asyncio
import gc
import json

import aiohttp
import numpy as np
import pytest
import soundfile as sf

from serve_cases import (SEARCH, SEARCH_FLAGS, collect, running, start_command, stop_command,  # noqa: F401
                         stream_file, streaming_model)
from test_transcribe import _one_thread  # noqa: F401  (an autouse fixture)

from ssm_fairseq.asr import Recognizer
from ssm_fairseq.asr.endpoints import EndpointRules
from ssm_fairseq.asr.stream import Stream
from ssm_fairseq.serve.protocol import PROTOCOL_ERRORS
from ssm_fairseq.serve.server import SpeechServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recognizer(streaming_model) -> Recognizer:
    return Recognizer(streaming_model.checkpoint, device="cpu", **SEARCH)


async def settled(server: SpeechServer) -> tuple[int, int]:
    """(connections, stepper sessions) once every handler has ended (at most 5 s)."""
    for _ in range(100):
        if not server.connections and not server.stepper.sessions:
            break
        await asyncio.sleep(0.05)
    return len(server.connections), len(server.stepper.sessions)


class BatchSizes:
    """Wraps ``recognizer.step_streams``: the number of streams of every step the server makes."""

    def __init__(self, recognizer: Recognizer):
        self.recognizer, self.sizes = recognizer, []
        self.step_streams = recognizer.step_streams

    def __enter__(self):
        def counting(chunks, sources=None):
            self.sizes.append(len(chunks))
            return self.step_streams(chunks, sources)
        self.recognizer.step_streams = counting
        return self

    def __exit__(self, *exc):
        del self.recognizer.step_streams


def test_concurrent_clients_get_the_offline_transcripts_with_their_streams_stepped_together(recognizer,
                                                                                          streaming_model):
    files = streaming_model.files
    offline = recognizer.transcribe(files, timestamps=True)
    assert all(t.text for t in offline)

    async def scenario():
        server = SpeechServer(recognizer, step_ms=160)
        async with running(server) as url, aiohttp.ClientSession() as http:
            return await asyncio.gather(*[stream_file(http, f"{url}/asr", path, realtime=0.2,
                                                      settings={"timestamps": True}) for path in files])

    with BatchSizes(recognizer) as batches:
        received = asyncio.run(scenario())
    assert max(batches.sizes) >= 2, batches.sizes  # the clients' streams went through the model together
    for got, want in zip(received, offline):
        final = got.final
        assert final["text"] == want.text and final["is_eof"] and final["is_final"]
        words = [w for segment in final["segments"] for w in segment["words"]]
        assert [w[0] for w in words] == [w.word for w in want.words]
        assert [t for w in words for t in w[1:]] == pytest.approx([t for w in want.words for t in w[1:]], abs=0.006)
        partials = [r for r in got.results if not r["is_final"]]
        assert partials and all(set(r) == {"text", "segment", "start", "is_final", "final"} for r in partials)
        assert got.texts == ["Done!"] and got.close_code == 1000  # sherpa-onnx's end of results, a normal close


def test_sherpa_onnx_clients_connect_at_the_root_and_read_text_until_done(recognizer, streaming_model):
    """sherpa-onnx's client connects to ws://HOST:PORT, sends float32 messages and Done, and reads JSON with "text"
    until "Done!"."""
    path = streaming_model.files[0]

    async def scenario():
        async with running(SpeechServer(recognizer)) as url, aiohttp.ClientSession() as http:
            return await stream_file(http, url, path, chunk=8000)

    got = asyncio.run(scenario())
    assert got.final["text"] == recognizer.transcribe([path])[0]
    assert got.texts == ["Done!"]


def test_endpoints_cut_segments_with_times_and_the_final_result_holds_them_all(recognizer, streaming_model):
    """With endpoints, ended segments come as is_final messages before the final one, which holds every segment;
    they are those the same stream gives alone in the same steps. (The tiny model, pushed to emit labels, never
    pauses: its segments end by the max_segment rule.)"""
    path = streaming_model.files[0]
    samples, _ = sf.read(str(path), dtype="float32")
    pause = np.zeros(16000, np.float32)
    long_file = path.parent / "with_pauses.wav"
    sf.write(long_file, np.concatenate([samples, pause, samples, pause, samples]), 16000, subtype="FLOAT")
    rules = EndpointRules(max_segment=1.5)
    alone = recognizer.stream(endpoints=rules)
    audio, _ = sf.read(str(long_file), dtype="float32")
    for start in range(0, len(audio), 2560):
        alone.accept_waveform(audio[start:start + 2560])
    want = alone.finish_segments()

    async def scenario():
        async with running(SpeechServer(recognizer, step_ms=160, endpoints=rules)) as url, \
                aiohttp.ClientSession() as http:
            return await stream_file(http, f"{url}/asr", long_file, chunk=2560, realtime=1.0)

    got = asyncio.run(scenario())
    final = got.final
    assert [(s["text"], s["start"], s["end"]) for s in final["segments"]] == \
        [(s.text, round(s.start, 2), round(s.end, 2)) for s in want]
    assert len(want) >= 2
    ended = [r for r in got.results if r["is_final"] and not r["final"]]
    assert [(r["segment"], r["text"]) for r in ended] == [(i, s.text) for i, s in enumerate(want[:len(ended)])]
    assert final["text"] == " ".join(s.text for s in want if s.text)


BAD_MESSAGES = {
    "text other than Done": (["hello"], "bad_message"),
    "a JSON list": (['[1, 2]'], "bad_message"),
    "odd byte count": ([b"\x00" * 7], "bad_audio"),
    "NaN samples": ([np.array([0.1, np.nan], "<f4").tobytes()], "bad_audio"),
    "infinite samples": ([np.array([np.inf], "<f4").tobytes()], "bad_audio"),
    "16-bit scale samples": ([np.array([0.5, 1200.0], "<f4").tobytes()], "bad_audio"),
    "8 kHz": (['{"sample_rate": 8000}'], "unsupported_sample_rate"),
    "unknown setting": (['{"language": "en"}'], "bad_settings"),
    "timestamps not a bool": (['{"timestamps": 1}'], "bad_settings"),
    "settings after audio": ([np.zeros(160, "<f4").tobytes(), '{"timestamps": true}'], "bad_settings"),
}


def test_bad_messages_get_named_errors_while_another_client_is_served(recognizer, streaming_model):
    path = streaming_model.files[1]

    async def bad_client(http, url, messages):
        async with http.ws_connect(url) as ws:
            reader = asyncio.create_task(collect(ws))
            for message in messages:
                await (ws.send_bytes(message) if isinstance(message, bytes) else ws.send_str(message))
            return await asyncio.wait_for(reader, 30)

    async def scenario():
        server = SpeechServer(recognizer)
        async with running(server) as url, aiohttp.ClientSession() as http:
            good = asyncio.create_task(stream_file(http, f"{url}/asr", path, realtime=0.5))
            bad = await asyncio.gather(*[bad_client(http, f"{url}/asr", messages)
                                         for messages, _ in BAD_MESSAGES.values()])
            good = await good
            return (bad, good, *await settled(server))

    bad, good, connections, sessions = asyncio.run(scenario())
    for (name, (_, code)), got in zip(BAD_MESSAGES.items(), bad):
        assert [r.get("code") for r in got.results] == [code], name
        assert got.results[0]["error"] and got.close_code == 1008, name
    assert set(code for _, code in BAD_MESSAGES.values()) <= set(PROTOCOL_ERRORS)
    assert good.final["text"] == recognizer.transcribe([path])[0]
    assert connections == sessions == 0


def test_a_stream_whose_features_are_not_finite_fails_alone_while_the_others_are_served(recognizer,
                                                                                    streaming_model):
    """Two clients stepped together; from their first step together on, one stream's filterbank gives NaN (finite
    samples can still make features that are not): that client gets a named bad_audio error, the other its offline
    transcript."""
    paths = streaming_model.files[:2]
    calls, poisoned = [], []
    step_streams = recognizer.step_streams

    def poisoning(chunks, sources=None):
        calls.append(len(chunks))
        if len(chunks) == 2 and not poisoned:
            stream = list(chunks)[1]
            accept = stream.filterbank.accept_waveform
            stream.filterbank.accept_waveform = lambda samples: np.full_like(accept(samples), np.nan)
            poisoned.append(stream)
        return step_streams(chunks, sources)

    async def scenario():
        server = SpeechServer(recognizer, step_ms=160)
        async with running(server) as url, aiohttp.ClientSession() as http:
            return await asyncio.gather(*[stream_file(http, f"{url}/asr", path, realtime=0.5) for path in paths])

    recognizer.step_streams = poisoning
    try:
        received = asyncio.run(scenario())
    finally:
        del recognizer.step_streams
    assert poisoned, calls  # the two streams were stepped together
    failed = [got for got in received if got.errors]
    assert len(failed) == 1 and [r["code"] for r in failed[0].errors] == ["bad_audio"]
    assert "not finite" in failed[0].errors[0]["error"]
    (path, good), = [(path, got) for path, got in zip(paths, received) if not got.errors]
    assert good.final["text"] == recognizer.transcribe([path])[0]


def test_vanished_and_idle_clients_are_dropped_while_the_others_are_served(recognizer, streaming_model):
    path = streaming_model.files[2]
    samples, _ = sf.read(str(path), dtype="float32")

    async def vanishing(http, url):  # half an utterance, then the connection drops without a close
        ws = await http.ws_connect(url)
        await ws.send_bytes(samples[:len(samples) // 2].tobytes())
        await asyncio.sleep(0.2)
        ws._response.connection.transport.abort()

    async def idle(http, url):  # connects, sends nothing
        async with http.ws_connect(url) as ws:
            return await asyncio.wait_for(collect(ws), 30)

    async def scenario():
        server = SpeechServer(recognizer, idle_timeout=1.0)
        async with running(server) as url, aiohttp.ClientSession() as http:
            results = await asyncio.gather(vanishing(http, f"{url}/asr"), idle(http, f"{url}/asr"),
                                           stream_file(http, f"{url}/asr", path, realtime=1.0))
            _, sessions = await settled(server)
            async with http.get(f"{url}/health") as health:
                return results, health.status, await health.json(), sessions

    (_, idle_got, good), status, health, sessions = asyncio.run(scenario())
    assert [r["code"] for r in idle_got.results] == ["idle_timeout"] and idle_got.close_code == 1008
    assert good.final["text"] == recognizer.transcribe([path])[0]
    assert status == 200 and health == {"status": "ok", "streams": 0} and sessions == 0


def test_nothing_is_kept_after_many_connect_disconnect_cycles(recognizer, streaming_model):
    """200 connections that stream a little and leave (half finish, half vanish): no stream, session or message
    survives them, and memory stays flat after the first ones."""
    samples, _ = sf.read(str(streaming_model.files[3]), dtype="float32")
    chunk = samples[:4800].tobytes()

    def rss_mb() -> float:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024

    async def cycle(http, url, finish):
        async with http.ws_connect(url) as ws:
            await ws.send_bytes(chunk)
            if finish:
                await ws.send_str("Done")
                await collect(ws)

    async def scenario():
        server = SpeechServer(recognizer)
        rss = []
        async with running(server) as url, aiohttp.ClientSession() as http:
            for i in range(200):
                await cycle(http, f"{url}/asr", finish=i % 2 == 0)
                if i in (49, 199):
                    await asyncio.sleep(0.5)
                    gc.collect()
                    rss.append(rss_mb())
            return (rss, *await settled(server))

    rss, connections, sessions = asyncio.run(scenario())
    gc.collect()
    assert connections == sessions == 0
    assert not [o for o in gc.get_objects() if type(o) is Stream]
    assert rss[1] - rss[0] < 20, f"RSS grew from {rss[0]:.0f} MB to {rss[1]:.0f} MB over 150 connections"


def test_the_command_serves_the_page_and_health_and_finishes_open_streams_on_sigterm(streaming_model, tmp_path):
    path = streaming_model.files[0]
    samples, _ = sf.read(str(path), dtype="float32")
    process, port = start_command(streaming_model.checkpoint, *SEARCH_FLAGS, "--save-audio", str(tmp_path))

    async def scenario():
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/") as page:
                html = await page.text()
            async with http.get(f"http://127.0.0.1:{port}/static/capture-worklet.js") as worklet:
                script = await worklet.text()
            async with http.get(f"http://127.0.0.1:{port}/health") as health:
                status = health.status
            ws = await http.ws_connect(f"http://127.0.0.1:{port}/asr")
            reader = asyncio.create_task(collect(ws))
            await ws.send_bytes(samples.tobytes())  # the whole utterance, but no Done: open at the signal
            await asyncio.sleep(1.0)
            process.send_signal(15)
            return html, script, status, await asyncio.wait_for(reader, 60)

    try:
        html, script, status, got = asyncio.run(scenario())
    finally:
        code, stderr = stop_command(process)
    assert code == 0, stderr
    assert status == 200 and 'id="start"' in html and "registerProcessor" in script
    assert got.final["text"] == Recognizer(streaming_model.checkpoint, device="cpu", **SEARCH).transcribe([path])[0]
    assert got.close_code == 1001 and got.texts == ["Done!"]  # going away, after the final result
    heard, rate = sf.read(str(tmp_path / "1.wav"), dtype="float32")
    assert rate == 16000 and np.array_equal(heard, samples)  # --save-audio: what the server heard, as sent


def test_done_after_every_sample_was_stepped_and_done_without_audio(recognizer, streaming_model):
    """Done with nothing left to step (the audio a whole number of steps, all stepped already), and Done with no
    audio at all: final results (the offline transcript; an empty one), and the server goes on stepping others."""
    samples, _ = sf.read(str(streaming_model.files[0]), dtype="float32")
    whole = samples[:len(samples) // 2560 * 2560]
    path = streaming_model.files[0].parent / "whole_steps.wav"
    sf.write(path, whole, 16000, subtype="FLOAT")

    async def stepped_then_done(http, url):
        async with http.ws_connect(url) as ws:
            reader = asyncio.create_task(collect(ws))
            await ws.send_bytes(whole.tobytes())
            await asyncio.sleep(2.0)  # every step taken before Done
            await ws.send_str("Done")
            return await reader

    async def only_done(http, url):
        async with http.ws_connect(url) as ws:
            await ws.send_str("Done")
            return await collect(ws)

    async def scenario():
        server = SpeechServer(recognizer, step_ms=160)
        async with running(server) as url, aiohttp.ClientSession() as http:
            first = await asyncio.gather(stepped_then_done(http, f"{url}/asr"), only_done(http, f"{url}/asr"))
            after = await stream_file(http, f"{url}/asr", streaming_model.files[1])
            return first, after

    (stepped, empty), after = asyncio.run(scenario())
    assert stepped.final["text"] == recognizer.transcribe([path])[0]
    assert empty.final == {"text": "", "segments": [], "segment": 0, "final": True, "is_final": True, "is_eof": True}
    assert after.final["text"] == recognizer.transcribe([streaming_model.files[1]])[0]
