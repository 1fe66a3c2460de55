"""``ssm-export-onnx``: a transducer checkpoint -> a directory of ONNX files for ONNX Runtime.

    ssm-export-onnx --checkpoint exp/.../checkpoint_avg5.pt --out exported/ [--int8] [--chunk-frames 32]
    ssm-export-onnx --checkpoint exp/.../checkpoint_best.pt --out offline/ --offline    # bidirectional models

writes ``encoder.onnx`` (the causal encoder's chunk step, every SSM state an input and an output), ``predictor.onnx``
(the LSTM predictor's step), ``joiner.onnx``, with ``--int8`` dynamically quantized copies (``*.int8.onnx``), and
``manifest.json`` (the metadata a runtime needs, and each file's SHA-256); see ``ssm_fairseq.deploy.exporter`` and
docs/deploy.md. The directory is transcribed by ``ssm_fairseq.deploy.recognizer.OnnxRecognizer`` (numpy and
ONNX Runtime, no torch). Only causal models on global CMVN export the chunk step (``mssm_transducer_streaming``, or
any transducer trained with ``--causal-encoder`` on the tr or ms sub-sampler); ``--offline`` exports instead the
whole-utterance encoder (``ssm_fairseq.deploy.offline_graph``: MSSM layers, bidirectional or causal, on the tr or
conv sub-sampler, global or utterance CMVN), which transcribes whole files only. Others are refused, named, and
nothing is left at ``--out``. ``python scripts/export_onnx.py`` runs the same ``main``.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

logger = logging.getLogger("ssm_fairseq.export_onnx")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ssm-export-onnx", description="Export a speech_transducer checkpoint "
                                     "to ONNX files (encoder chunk step or --offline whole-utterance encoder, "
                                     "predictor step, joiner).")
    parser.add_argument("--checkpoint", type=Path, required=True, help="fairseq-train --task speech_transducer "
                        "checkpoint of a causal model (e.g. --arch mssm_transducer_streaming)")
    parser.add_argument("--out", type=Path, required=True, help="the directory to write (must not exist, unless "
                        "--overwrite)")
    parser.add_argument("--data-dir", type=Path, default=None, help="data directory with config.yaml and the "
                        "dictionary (default: the one the checkpoint was trained on)")
    parser.add_argument("--chunk-frames", type=int, default=None, metavar="N",
                        help="feature frames (10 ms) per encoder call: a multiple of the sub-sampling stride "
                             "(default 32, 320 ms)")
    parser.add_argument("--offline", action="store_true", help="export the whole-utterance encoder (bidirectional "
                        "models; whole files only, no streaming)")
    parser.add_argument("--piece-frames", type=int, default=None, metavar="N",
                        help="--offline: encoder frames per piece of its chunked convolutions (default 16)")
    parser.add_argument("--cmvn-adapt", dest="cmvn_adapt_frames", type=float, default=None, metavar="FRAMES",
                        help="adaptive CMVN after the data directory's global CMVN, as ssm-transcribe --cmvn-adapt: "
                             "each frame also normalised by the running statistics of its utterance or stream, "
                             "pooled with FRAMES frames of the training set's (default: the directory's CMVN)")
    parser.add_argument("--int8", action="store_true", help="also write dynamically quantized copies (*.int8.onnx)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out (once the new one is "
                        "complete)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stderr, force=True)
    from ..deploy.exporter import DEFAULT_CHUNK_FRAMES, export_checkpoint
    from ..deploy.offline_graph import DEFAULT_PIECE_FRAMES

    if args.offline and args.chunk_frames is not None or not args.offline and args.piece_frames is not None:
        logger.error("--chunk-frames sets the streaming chunk step, --piece-frames the --offline encoder: not both")
        return 1
    start = time.perf_counter()
    try:
        out = export_checkpoint(args.checkpoint, args.out, args.data_dir, args.chunk_frames or DEFAULT_CHUNK_FRAMES,
                                args.int8, args.overwrite, args.offline, args.piece_frames or DEFAULT_PIECE_FRAMES,
                                args.cmvn_adapt_frames)
    except (OSError, ValueError) as error:  # named: not streamable, unsupported, missing files, --out exists
        logger.error(f"{type(error).__name__}: {error}")
        return 1
    logger.info(f"exported {args.checkpoint} -> {out} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
