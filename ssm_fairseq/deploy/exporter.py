"""Export a transducer checkpoint to a directory of ONNX files that ONNX Runtime runs without PyTorch.

    from ssm_fairseq.deploy.exporter import export_checkpoint
    export_checkpoint("checkpoint_avg5.pt", "exported/", chunk_frames=32, int8=True)
    export_checkpoint("checkpoint_best.pt", "offline/", offline=True)   # a bidirectional (whole-utterance) model

The checkpoint is loaded as ``ssm-transcribe`` loads it (``asr.Recognizer``: every checkpoint and data check, the
dictionary, the evaluation feature transforms, the search's suppressed units), refused unless its encoder and transforms
can stream (``NotStreamableError``) or, with ``offline``, unless its encoder has a whole-utterance graph
(``offline_graph``) and its features one CMVN, and its three graphs (``export_graphs``) are traced with
``torch.onnx.export`` (the TorchScript exporter, ``dynamo=False``; opset 17), checked with ``onnx.checker`` and given
the directory's metadata (``manifest``). ``int8`` adds dynamically quantized copies (``onnxruntime``'s
``quantize_dynamic``: 8-bit weights of the Linear layers, activations quantized per call; the SSM chunk matrices stay
float32). Weights are unsigned (``QUInt8``): with signed weights onnxruntime multiplies unsigned activations by them
with an instruction (``VPMADDUBSW``) whose pairwise sums saturate at 16 bits on x86 CPUs without VNNI (AVX2, or AVX-512
without VNNI), which made the quantized encoder's outputs wrong there (mean error 33-130% of the outputs' magnitude on a
tiny model, against 2-3% with unsigned weights; docs/deploy.md).

Everything is written to a hidden temporary directory beside ``out``, which is renamed to ``out`` only once complete
(``manifest.json`` written last), so an interrupted export leaves no directory that looks complete; an existing
``out`` is refused unless ``overwrite``, and then replaced only after the new directory is complete.
"""
from __future__ import annotations

import json
import logging
import math
import os
import secrets
import shutil
import uuid
import warnings
from pathlib import Path

import onnx
import torch

from .errors import NotStreamableError, UnsupportedModelError
from .export_graphs import EncoderChunkStep, JoinerStep, PredictorStep
from .offline_graph import DEFAULT_PIECE_FRAMES, OfflineEncoder
from .manifest import FORMAT_VERSION, GRAPHS, METADATA_KEY, graph_file, write_manifest

OPSET = 17
DEFAULT_CHUNK_FRAMES = 32  # 320 ms, ssm-transcribe --stream's default chunk
FEATURES = {"kind": "kaldi_fbank", "sample_rate": 16000, "num_mel_bins": 80, "frame_length_ms": 25.0,
            "frame_shift_ms": 10.0, "window": "povey", "preemphasis": 0.97, "low_freq": 20.0, "dither": 0.0,
            "pcm_scale": 32768.0, "snip_edges": True}  # audio_features.log_mel_filterbank's settings


def _export_graph(module: torch.nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
                  dynamic_axes: dict | None = None) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the shapes traced as constants are fixed ones
        # the TorchScript exporter's notice of its deprecation, and its LSTM batch-size advice (h0, c0 are inputs)
        warnings.filterwarnings("ignore", message="You are using the legacy TorchScript-based ONNX export")
        warnings.filterwarnings("ignore", message="Exporting a model to ONNX with a batch_size other than 1")
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs, opset_version=OPSET,
                          dynamic_axes=dynamic_axes or {}, dynamo=False)


def _set_metadata(path: Path, metadata: dict, graph: str) -> None:
    model = onnx.load(str(path))
    del model.metadata_props[:]
    for key, value in ((METADATA_KEY, json.dumps(metadata)), ("graph", graph)):
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path), full_check=True)


def _encoder_graph(model, metadata: dict, offline: bool, chunk_frames: int, piece_frames: int, path: Path) -> dict:
    """Export the encoder to ``path``: the chunk step (streaming) or the whole-utterance graph (``offline``); the
    metadata it adds."""
    bins = metadata["features"]["num_mel_bins"]
    if offline:
        encoder = OfflineEncoder(model.encoder, model.joiner.encoder_proj, piece_frames).eval()
        frames = {1: "encoder_frames"}
        _export_graph(encoder, (torch.zeros(1, 8 * piece_frames, bins),), path, ["features"],
                      ["encoder_out", "encoder_proj"], {"features": {1: "frames"}, "encoder_out": frames,
                                                        "encoder_proj": frames})
        return {"encoder": "offline", "piece_frames": piece_frames}
    step = EncoderChunkStep(model.encoder, model.joiner.encoder_proj, chunk_frames).eval()
    names = step.state_names()
    _export_graph(step, (torch.zeros(1, chunk_frames, bins), torch.tensor([chunk_frames]), *step.initial_states()),
                  path, ["features", "valid_frames", *names],
                  ["encoder_out", "encoder_proj", "encoder_frames", *[f"next_{n}" for n in names]])
    return {"encoder": "streaming", "chunk_frames": chunk_frames, "subsampling_stride": step.stride,
            "encoder_frames_per_chunk": chunk_frames // step.stride, "look_ahead_frames": 0, "state_names": names,
            "state_shapes": [list(s) for s in step.state_shapes()]}


def export_model(model, metadata: dict, out: Path | str, chunk_frames: int = DEFAULT_CHUNK_FRAMES,
                 int8: bool = False, overwrite: bool = False, offline: bool = False,
                 piece_frames: int = DEFAULT_PIECE_FRAMES) -> Path:
    """Export a ``TransducerModel`` (eval mode, float32) to the directory ``out``; ``metadata``: what the runtime
    needs beyond the graphs (``checkpoint_metadata`` of a checkpoint; the encoder's settings, format and export id
    are added here). The encoder is the causal chunk step of ``chunk_frames`` feature frames, or with ``offline``
    the whole-utterance graph (``offline_graph``, chunked convolutions of ``piece_frames`` encoder frames). The
    encoder graph is built (and a model it cannot export refused) before anything is written. Returns ``out``."""
    model.float()
    model.eval()  # not chained: after fairseq's make_generation_fast_, eval() returns None
    if offline:
        OfflineEncoder(model.encoder, model.joiner.encoder_proj, piece_frames)
    else:
        EncoderChunkStep(model.encoder, model.joiner.encoder_proj, chunk_frames)
    predictor = model.predictor
    layers, hidden = len(predictor.lstms), predictor.hidden_dim
    metadata = dict(metadata, format_version=FORMAT_VERSION, export_id=uuid.uuid4().hex,
                    predictor_layers=layers, predictor_hidden=hidden, joint_dim=model.joiner.output.in_features,
                    vocab_size=model.joiner.output.out_features, encoder_dim=model.joiner.encoder_proj.in_features,
                    int8=int8)
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists: choose another --out, or --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.with_name(f".{out.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    work.mkdir()
    try:
        metadata.update(_encoder_graph(model, metadata, offline, chunk_frames, piece_frames,
                                       work / graph_file("encoder")))
        tokens, zeros = torch.zeros(2, dtype=torch.long), torch.zeros(layers, 2, hidden)
        rows = {0: "rows"}
        _export_graph(PredictorStep(model.predictor, model.joiner).eval(), (tokens, zeros, zeros),
                      work / graph_file("predictor"), ["tokens", "h", "c"], ["predictor_proj", "next_h", "next_c"],
                      {"tokens": rows, "h": {1: "rows"}, "c": {1: "rows"}, "predictor_proj": rows,
                       "next_h": {1: "rows"}, "next_c": {1: "rows"}})
        joint = torch.zeros(2, metadata["joint_dim"])
        _export_graph(JoinerStep(model.joiner).eval(), (joint, joint), work / graph_file("joiner"),
                      ["encoder_proj", "predictor_proj"], ["logits"],
                      {"encoder_proj": rows, "predictor_proj": rows, "logits": rows})
        files = [graph_file(g) for g in GRAPHS]
        for graph in GRAPHS:
            _set_metadata(work / graph_file(graph), metadata, graph)
        if int8:
            files += _quantize(work, metadata)
        write_manifest(work, metadata, files)
        _move_into_place(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _recurrence_products(path: Path) -> list[str]:
    """The ``MatMul`` nodes of a graph whose constant operand is 3-D: the SSM stages' per-channel chunk matrices
    (``chunk_layers.chunk_matrix``), which hold the states' decay over a chunk (``dA^L``, close to 1 for the slow
    channels: in 8 bits the decay, and the memory it sets, would be lost)."""
    model = onnx.load(str(path))
    three_d = {init.name for init in model.graph.initializer if len(init.dims) == 3}
    return [node.name for node in model.graph.node
            if node.op_type == "MatMul" and any(name in three_d for name in node.input)]


def _quantize(directory: Path, metadata: dict) -> list[str]:
    """Dynamically quantized copies of the three graphs (unsigned 8-bit weights of the Linear layers: the module
    docstring says why; the SSM chunk matrices kept in float32); their names."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    names = []
    for graph in GRAPHS:
        source, target = directory / graph_file(graph), directory / graph_file(graph, "int8")
        logging.disable(logging.WARNING)  # the quantizer's advice and notes, on the root logger, for every graph
        try:
            quantize_dynamic(str(source), str(target), weight_type=QuantType.QUInt8,
                             nodes_to_exclude=_recurrence_products(source))
        finally:
            logging.disable(logging.NOTSET)
        _set_metadata(target, metadata, graph)
        names.append(target.name)
    return names


def _move_into_place(work: Path, out: Path) -> None:
    """Rename the complete ``work`` directory to ``out``; an existing ``out`` is moved aside first and removed only
    after the rename."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.{os.getpid()}-{secrets.token_hex(4)}.old")
        os.rename(out, old)
    try:
        os.rename(work, out)
    except BaseException:
        if old is not None:
            os.rename(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def runtime_metadata(dictionary, blank: int, suppress, frame_seconds: float, cmvn=None, adaptive=None) -> dict:
    """What a runtime needs besides the graphs: the features and their CMVN (``cmvn``: fairseq's ``GlobalCMVN``
    transform, whose statistics are kept, its ``UtteranceCMVN``, whose settings are kept, or None; ``adaptive``: the
    ``AdaptiveCMVN`` after global CMVN, whose prior is kept, or None), the vocabulary (a fairseq ``Dictionary``'s units
    in id order), the blank, the units the search never emits (``suppress``) and those the text drops (``<s>``,
    ``</s>``, as ``Dictionary.string``), ``<unk>``, and the seconds one encoder frame stands for."""
    utterance = cmvn is not None and type(cmvn).__name__ == "UtteranceCMVN"
    # an infinite prior is global CMVN alone (and JSON has no infinity)
    prior = None if adaptive is None or math.isinf(adaptive.prior_frames) else float(adaptive.prior_frames)
    return {"features": FEATURES,
            "global_cmvn": None if cmvn is None or utterance else {"mean": [float(v) for v in cmvn.mean],
                                                                   "std": [float(v) for v in cmvn.std]},
            "utterance_cmvn": {"norm_means": bool(cmvn.norm_means), "norm_vars": bool(cmvn.norm_vars)}
            if utterance else None,
            "adaptive_cmvn": None if prior is None else {"prior_frames": prior},
            "vocabulary": list(dictionary.symbols), "blank": int(blank), "suppress": sorted(int(i) for i in suppress),
            "strip": sorted({int(dictionary.bos()), int(dictionary.eos())}), "unk": int(dictionary.unk()),
            "unk_word": dictionary.unk_word, "frame_seconds": float(frame_seconds)}


RUNTIME_TRANSFORMS = ([], ["GlobalCMVN"], ["UtteranceCMVN"], ["GlobalCMVN", "AdaptiveCMVN"])


def checkpoint_metadata(recognizer, offline: bool = False) -> dict:
    """``runtime_metadata`` of a loaded ``asr.Recognizer``. Raises ``NotStreamableError`` for a model or feature
    transforms that need the whole utterance (unless ``offline``: the whole-utterance encoder takes utterance CMVN
    too) and ``UnsupportedModelError`` for other feature transforms or a pre-tokenizer (its decoding has no torch-free
    form here)."""
    transforms = [] if recognizer.feature_transforms is None else recognizer.feature_transforms.transforms
    names = [type(t).__name__ for t in transforms]
    if names not in RUNTIME_TRANSFORMS:
        raise UnsupportedModelError(f"the data directory's feature transforms {names}: the ONNX runtime applies "
                                    "global CMVN (then, optionally, adaptive CMVN) or utterance CMVN")
    if not offline:
        problem = recognizer.streaming_problem()
        if problem:
            raise NotStreamableError(f"{problem} (ssm-export-onnx --offline exports the whole-utterance encoder)")
    if recognizer.tokenizer is not None:
        raise UnsupportedModelError(f"the data directory's pre_tokenizer {recognizer.task.data_cfg.pre_tokenizer} "
                                    "rewrites the text after decoding; the ONNX runtime joins SentencePiece units only")
    cmvn = transforms[0] if transforms else None  # global or utterance CMVN (above, or streaming_problem)
    adaptive = transforms[1] if len(transforms) > 1 else None  # adaptive CMVN after global CMVN
    generator = recognizer.generator
    if set(generator.symbols_to_strip_from_output) != {recognizer.dictionary.bos(), recognizer.dictionary.eos()}:
        raise UnsupportedModelError(f"the search strips {sorted(generator.symbols_to_strip_from_output)} from its "
                                    "output; the runtime strips <s> and </s>")
    return runtime_metadata(recognizer.dictionary, recognizer.model.blank, generator.suppress,
                            recognizer.frame_seconds, cmvn, adaptive)


def export_checkpoint(checkpoint: Path | str, out: Path | str, data_dir: Path | str | None = None,
                      chunk_frames: int = DEFAULT_CHUNK_FRAMES, int8: bool = False, overwrite: bool = False,
                      offline: bool = False, piece_frames: int = DEFAULT_PIECE_FRAMES,
                      cmvn_adapt_frames: float | None = None) -> Path:
    """Export a ``speech_transducer`` checkpoint (with its data directory, or ``data_dir``) to ``out``: its
    streaming chunk step, or with ``offline`` its whole-utterance encoder (``export_model``). ``cmvn_adapt_frames``:
    adaptive CMVN after the data directory's global CMVN, as ``ssm-transcribe --cmvn-adapt`` decodes
    (``asr.DecodingOptions``); None: the data directory's CMVN."""
    from ..asr.recognizer import Recognizer
    from ..asr.transducer.model import TransducerModel

    try:
        recognizer = Recognizer(checkpoint, data_dir=data_dir, device="cpu", beam=1,
                                cmvn_adapt_frames=cmvn_adapt_frames)
    except ValueError as error:
        if "--task" in str(error):
            raise UnsupportedModelError(str(error)) from error
        raise
    if type(recognizer.model) is not TransducerModel:
        raise UnsupportedModelError(f"{checkpoint}: a {type(recognizer.model).__name__}; the exporter handles the "
                                    "transducer model")
    metadata = checkpoint_metadata(recognizer, offline)
    metadata["source"] = {"checkpoint": str(checkpoint), "architecture": recognizer.model.cfg._name}
    return export_model(recognizer.model, metadata, out, chunk_frames, int8, overwrite, offline, piece_frames)
