"""``ssm-serve``: live speech recognition over WebSocket, with a microphone page, from a causal transducer checkpoint.

    ssm-serve --checkpoint exp/mini_streaming/checkpoints/mssm_transducer_streaming/checkpoint_avg3.pt --port 6006

then open http://localhost:6006/ (browsers give the microphone to pages of localhost or https only). One model is
loaded and serves every connection: one stream per connection, all streams stepped as one batch
(``ssm_fairseq.serve``). The protocol (``ssm_fairseq.serve.protocol``) is sherpa-onnx's: float32 16 kHz samples as
binary messages, ``Done`` to end, JSON results. Runs until SIGINT or SIGTERM, then finishes the open streams and
exits 0. Prints ``{"listening": PORT}`` on stdout once it listens. Needs the ``serve`` extra (aiohttp):
``pip install "ssm_fairseq[serve]"``.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import fields
from pathlib import Path

from ..asr.endpoints import DEFAULT_MAX_SEGMENT, DEFAULT_SILENCE_AFTER_SPEECH, DEFAULT_SILENCE_WITHOUT_SPEECH, \
    EndpointRules
from ..asr.options import DecodingOptions
from .transcribe import _add_search_arguments, load_recognizer

logger = logging.getLogger("ssm_fairseq.serve")

DEFAULT_PORT = 6006


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ssm-serve", description="Serve live speech recognition over WebSocket "
                                                                   "(sherpa-onnx's protocol) with a microphone page.")
    parser.add_argument("--checkpoint", required=True, help="a causal speech_transducer checkpoint trained on global "
                                                            "CMVN (e.g. --arch mssm_transducer_streaming)")
    parser.add_argument("--data-dir", default=None, help="data directory with config.yaml and the dictionary "
                                                         "(default: the one the checkpoint was trained on)")
    parser.add_argument("--host", default="localhost", help="address to listen on (default localhost; 0.0.0.0: all)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free)")
    parser.add_argument("--chunk-ms", type=_positive(float), default=160.0,
                        help="audio per step of a stream, milliseconds (default 160): a stream is stepped once it "
                             "has this much; a stream that fell behind steps several at once")
    parser.add_argument("--idle-timeout", type=_positive(float), default=20.0,
                        help="seconds without a message before a connection gets idle_timeout (default 20)")
    parser.add_argument("--max-connections", type=_positive(int), default=64, help="open connections at most")
    parser.add_argument("--no-endpoints", action="store_true",
                        help="one segment per utterance (default: segments end at pauses, ssm_fairseq.asr.endpoints)")
    parser.add_argument("--silence-after-speech", type=_positive(float), default=DEFAULT_SILENCE_AFTER_SPEECH,
                        help=f"endpoint rule 2, seconds (default {DEFAULT_SILENCE_AFTER_SPEECH})")
    parser.add_argument("--silence-without-speech", type=_positive(float), default=DEFAULT_SILENCE_WITHOUT_SPEECH,
                        help=f"endpoint rule 1, seconds (default {DEFAULT_SILENCE_WITHOUT_SPEECH})")
    parser.add_argument("--max-segment", type=_positive(float), default=DEFAULT_MAX_SEGMENT,
                        help=f"endpoint rule 3, seconds (default {DEFAULT_MAX_SEGMENT})")
    parser.add_argument("--save-audio", type=Path, default=None, metavar="DIR",
                        help="write each connection's audio, as received, to DIR/N.wav (float32, 16 kHz) when it "
                             "closes (N: the connection's number in the log)")
    parser.add_argument("--threads", type=_positive(int), default=1,
                        help="torch threads for the model (default 1: a step's tensors are small, and threads that "
                             "wait for each other on cores shared with other work cost more than they save)")
    parser.add_argument("--cpu", action="store_true", help="run on CPU even if CUDA is available")
    precision = parser.add_mutually_exclusive_group()
    for flag, dtype in (("--fp16", "float16"), ("--bf16", "bfloat16")):
        precision.add_argument(flag, action="store_const", const=dtype, dest="precision", default="float32",
                               help=f"decode in {dtype}")
    _add_search_arguments(parser)
    args = parser.parse_args(argv)
    args.max_tokens = args.batch_size = None  # offline batching: not used by streams
    for field in fields(DecodingOptions):  # the other offline-only settings (long files' windows) at their defaults
        if not hasattr(args, field.name):
            setattr(args, field.name, field.default)
    args.compile = False  # streams step eagerly (layers/compiled.py compiles the batched forward only)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stderr, force=True)
    try:
        from ..serve.server import SpeechServer, ready_line, serve
    except ImportError as error:
        logger.error(f"ssm-serve needs aiohttp ({error}): pip install 'ssm_fairseq[serve]'")
        return 1
    import torch
    torch.set_num_threads(args.threads)
    try:
        recognizer = load_recognizer(args)
        problem = recognizer.streaming_problem()
        if problem:
            raise ValueError(f"{args.checkpoint}: cannot serve live streams: {problem}")
    except (FileNotFoundError, ValueError) as error:
        logger.error(str(error))
        return 1
    endpoints = None if args.no_endpoints else EndpointRules(args.silence_without_speech, args.silence_after_speech,
                                                             args.max_segment)
    if args.save_audio is not None:
        args.save_audio.mkdir(parents=True, exist_ok=True)
    server = SpeechServer(recognizer, args.chunk_ms, endpoints, args.idle_timeout, args.max_connections,
                          args.save_audio)
    asyncio.run(serve(server, args.host, args.port, lambda port: print(ready_line(port), flush=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
