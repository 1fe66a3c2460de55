#!/usr/bin/env python
"""ssm-serve under load, on loopback: final-result latency and server CPU against concurrent clients, and memory over
many connect/disconnect cycles.

    flock /tmp/cpu.lock python scripts/benchmarks/server_load.py --checkpoint /work/models/mini_streaming/\
checkpoints/mssm_transducer_streaming/checkpoint_avg5.pt --corpus recipes/librispeech/mini/LibriSpeech/test-mini

The server is the ``ssm-serve`` command, started once in its own process (``--cpu``, its ``--chunk-ms`` steps;
search flags as given). For each number of clients (``--clients``) and each speed (``--speeds``: 1 = real time, the
audio sent as fast as a microphone gives it; 4 = four times faster), that many clients run at once, each streaming
``--utterances`` files of the corpus one after the other (a new connection each) in ``--message-ms`` binary
messages, then ``Done``. A final result's latency is the time from sending its utterance's last audio message to
receiving its final result: the end of speech to the transcript on the client's side, loopback network included.
The table gives its 50th and 95th percentiles and maximum over all utterances, the server's CPU use over the run
(its process's user + system time / wall time: 100% is one core), its peak resident memory, and how many final
transcripts differ from offline decoding of the same file (``Recognizer.transcribe`` in this process; 0 unless a
near tie flips in float rounding). The clients run in this process, on the same cores as the server.

Then ``--cycles`` connections, one after the other, each sending 0.3 s of audio and then leaving (every other one
with ``Done`` and its final result, the others by dropping the connection): the server's resident memory after a
tenth of them and after all, and the connections still open on the server at the end (0). Linux only (``/proc``).
Run alone (``flock /tmp/cpu.lock``): the figures are times.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[2]
SEARCH_FLAGS = ("beam", "max_symbols_per_frame", "blank_penalty")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--corpus", type=Path, default=REPO / "recipes/librispeech/mini/LibriSpeech/test-mini",
                        help="a directory of .flac files (16 kHz) to stream (default: the mini corpus' test-mini)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8, 12])
    parser.add_argument("--speeds", type=float, nargs="+", default=[1.0, 4.0],
                        help="audio seconds sent per second (1: real time)")
    parser.add_argument("--utterances", type=int, default=3, help="files each client streams per configuration")
    parser.add_argument("--message-ms", type=float, default=100.0, help="audio per binary message (default 100)")
    parser.add_argument("--chunk-ms", type=float, default=160.0, help="the server's --chunk-ms (default 160)")
    parser.add_argument("--cycles", type=int, default=1000, help="connect/disconnect cycles (0: none)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-symbols-per-frame", type=int, default=None)
    parser.add_argument("--blank-penalty", type=float, default=None)
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads (ssm-serve's default, 1)")
    return parser.parse_args(argv)


def server_flags(args) -> list[str]:
    flags = []
    for name in SEARCH_FLAGS:
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags


class Server:
    """``ssm-serve`` in a child process, with its CPU time and memory read from ``/proc``."""

    def __init__(self, args):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ssm_fairseq.cli.serve", "--checkpoint", str(args.checkpoint), "--port", "0",
             "--cpu", "--chunk-ms", str(args.chunk_ms), "--threads", str(args.threads), "--max-connections", "256",
             "--no-endpoints", *server_flags(args)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"ssm-serve exited {self.process.wait()} before listening")
        self.url = f"http://127.0.0.1:{json.loads(line)['listening']}"

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def memory_mib(self, field: str) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"{field} not in /proc/{self.process.pid}/status")

    def reset_peak(self) -> None:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)


async def stream_utterance(http, url: str, samples: np.ndarray, message: int, speed: float) -> tuple[float, str]:
    """One utterance through one connection, paced at ``speed`` x real time -> (latency seconds, final text)."""
    async with http.ws_connect(f"{url}/asr", max_msg_size=0) as ws:
        final: asyncio.Future = asyncio.get_running_loop().create_future()

        async def read():
            async for reply in ws:
                if reply.type.name == "TEXT" and reply.data.startswith("{"):
                    result = json.loads(reply.data)
                    if "error" in result:
                        final.set_exception(RuntimeError(f"server error {result['code']}: {result['error']}"))
                        return
                    if result.get("final"):
                        final.set_result((time.perf_counter(), result["text"]))
            if not final.done():
                final.set_exception(RuntimeError(f"closed ({ws.close_code}) before the final result"))

        reader = asyncio.create_task(read())
        start = time.perf_counter()
        for index, begin in enumerate(range(0, len(samples), message)):
            due = start + begin / 16000 / speed  # a microphone's pace: the message's audio has been spoken
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            await ws.send_bytes(samples[begin:begin + message].tobytes())
        await asyncio.sleep(max(0.0, start + len(samples) / 16000 / speed - time.perf_counter()))
        last_sent = time.perf_counter()
        await ws.send_str("Done")
        received, text = await final
        await reader
        return received - last_sent, text


async def load(server: Server, audio: list[np.ndarray], clients: int, speed: float, utterances: int,
               message: int) -> tuple[list[float], list[tuple[int, str]]]:
    import aiohttp

    async def client(number: int):
        done = []
        for k in range(utterances):
            index = (number * utterances + k) % len(audio)
            await asyncio.sleep(0.05 * number / clients)  # clients do not start in the same millisecond
            latency, text = await stream_utterance(http, server.url, audio[index], message, speed)
            done.append((latency, index, text))
        return done

    async with aiohttp.ClientSession() as http:
        per_client = await asyncio.gather(*[client(n) for n in range(clients)])
    results = [r for rs in per_client for r in rs]
    return [r[0] for r in results], [(r[1], r[2]) for r in results]


async def cycles(server: Server, samples: np.ndarray, count: int) -> list[tuple[int, float]]:
    import aiohttp
    chunk = samples[:4800].tobytes()
    memory = []
    async with aiohttp.ClientSession() as http:
        for i in range(1, count + 1):
            ws = await http.ws_connect(f"{server.url}/asr")
            await ws.send_bytes(chunk)
            if i % 2:
                await ws.send_str("Done")
                async for _ in ws:
                    pass
            else:
                ws._response.connection.transport.abort()  # gone without a close
                await ws.close()
            if i in (count // 10, count):
                await asyncio.sleep(0.5)
                memory.append((i, server.memory_mib("VmRSS")))
        async with http.get(f"{server.url}/health") as health:
            open_streams = (await health.json())["streams"]
    return memory + [(-1, open_streams)]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


def main(argv=None) -> int:
    args = parse_args(argv)
    files = sorted(args.corpus.glob("**/*.flac"))
    if not files:
        raise SystemExit(f"no .flac files under {args.corpus}")
    audio = [sf.read(str(path), dtype="float32")[0] for path in files]
    import torch
    torch.set_num_threads(args.threads)
    from ssm_fairseq.asr import Recognizer
    options = {name: getattr(args, name) for name in SEARCH_FLAGS if getattr(args, name) is not None}
    offline = Recognizer(args.checkpoint, device="cpu", **options).transcribe(files)
    seconds = sum(len(a) for a in audio) / 16000
    print(f"{len(files)} files, {seconds:.1f} s of audio, {seconds / len(files):.2f} s each on average; "
          f"server --chunk-ms {args.chunk_ms:g}, {args.message_ms:g} ms messages, {os.cpu_count()} CPUs, "
          f"search {options or 'beam 4'}", flush=True)
    server = Server(args)
    message = round(args.message_ms * 16)
    rows = []
    try:
        asyncio.run(load(server, audio, 1, 8.0, 1, message))  # warm-up
        for speed in args.speeds:
            for clients in args.clients:
                server.reset_peak()
                cpu, wall = server.cpu_seconds(), time.perf_counter()
                latencies, texts = asyncio.run(load(server, audio, clients, speed, args.utterances, message))
                cpu, wall = server.cpu_seconds() - cpu, time.perf_counter() - wall
                wrong = sum(text != offline[index] for index, text in texts)
                rows.append((clients, speed, len(latencies), 1000 * percentile(latencies, 50),
                             1000 * percentile(latencies, 95), 1000 * max(latencies), 100 * cpu / wall,
                             server.memory_mib("VmHWM"), wrong))
                print(f"  {clients} clients at {speed:g}x: p95 {rows[-1][4]:.0f} ms", file=sys.stderr, flush=True)
        memory = asyncio.run(cycles(server, audio[0], args.cycles)) if args.cycles else []
    finally:
        status = server.stop()
    print()
    print("| clients | speed | utterances | final latency p50 | p95 | max | server CPU | server peak RSS | "
          "differ from offline |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for clients, speed, count, p50, p95, most, cpu, rss, wrong in rows:
        print(f"| {clients} | {speed:g}x | {count} | {p50:.0f} ms | {p95:.0f} ms | {most:.0f} ms | {cpu:.0f}% | "
              f"{rss:.0f} MiB | {wrong} |")
    if memory:
        (first, first_rss), (last, last_rss), (_, open_streams) = memory
        print()
        print("| connect/disconnect cycles | server RSS after | RSS after all | growth | streams open after |")
        print("|---:|---:|---:|---:|---:|")
        print(f"| {last} | {first_rss:.0f} MiB after {first} | {last_rss:.0f} MiB | {last_rss - first_rss:+.1f} MiB "
              f"| {open_streams} |")
    print(f"\nssm-serve exited {status} on SIGTERM")
    return 0


if __name__ == "__main__":
    sys.exit(main())
