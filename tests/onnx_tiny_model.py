"""A tiny untrained transducer built in memory for the ONNX tests, its runtime metadata, and audio of the mini corpus.

The search of an untrained model mostly takes the blank; a blank penalty far above the logits' spread makes it emit
labels, so the transcripts compared are not empty.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from fairseq.data import Dictionary

from ssm_fairseq.asr.encoder.subsampling import subsampling_stride
from ssm_fairseq.asr.features.audio_features import log_mel_filterbank
from ssm_fairseq.asr.transducer.joiner import Joiner
from ssm_fairseq.asr.transducer.model import TransducerConfig, TransducerModel
from ssm_fairseq.asr.transducer.predictor import Predictor
from ssm_fairseq.deploy.exporter import runtime_metadata

REPO = Path(__file__).resolve().parents[1]
MINI_TEST = sorted((REPO / "recipes/librispeech/mini/LibriSpeech/test-mini").glob("*/*/*.flac"))
UNITS = ["\u2581a", "\u2581b", "c", "d", "\u2581ef", "g", "\u2581", "h"]
SEARCHES = {"greedy": {"beam": 1, "max_symbols_per_frame": 2, "blank_penalty": 20.0},
            "beam": {"beam": 3, "max_symbols_per_frame": 2, "blank_penalty": 20.0}}


class Stats:
    """Global-CMVN statistics as fairseq's ``GlobalCMVN`` holds them."""

    def __init__(self, features: np.ndarray):
        self.mean, self.std = features.mean(0).astype(np.float64), features.std(0).astype(np.float64) + 1e-3

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.divide(np.subtract(x, self.mean), self.std)


def tiny_model(subsampler: str = "tr", causal: bool = True, seed: int = 0) -> TransducerModel:
    """A 2-layer causal MSSM transducer of width 32 on the ``subsampler``, in eval mode."""
    torch.manual_seed(seed)
    cfg = TransducerConfig(encoder_layers=2, encoder_embed_dim=32, encoder_ffn_embed_dim=64, ssm_heads=4,
                           ssm_state_size=8, subsampler=subsampler, causal_encoder=causal, dropout=0.0,
                           predictor_embed_dim=16, predictor_hidden_dim=16, predictor_layers=2,
                           predictor_dropout=0.0, joint_dim=24, max_source_positions=6000, max_target_positions=1024)
    dictionary = Dictionary()
    for unit in UNITS:
        dictionary.add_symbol(unit)
    predictor = Predictor(len(dictionary), 16, 16, 2, 0.0, padding_idx=dictionary.pad())
    model = TransducerModel(cfg, dictionary, TransducerModel.build_encoder(cfg), predictor,
                            Joiner(32, 16, 24, len(dictionary)))
    model.dictionary = dictionary
    return model.eval()


def metadata_of(model: TransducerModel, cmvn: Stats | None) -> dict:
    d = model.dictionary
    stride = subsampling_stride(model.cfg.subsampler, model.cfg.tr_stride)
    return runtime_metadata(d, model.blank, sorted({d.pad(), d.unk(), d.eos()}), stride * 0.01, cmvn)


def mini_features(count: int = 3) -> tuple[list[Path], list[np.ndarray], Stats]:
    """The first ``count`` mini test files, their filterbanks (the project's) and CMVN statistics over them."""
    import soundfile as sf

    files = MINI_TEST[:count]
    fbanks = [log_mel_filterbank(sf.read(str(f), dtype="float32")[0], 16000) for f in files]
    return files, fbanks, Stats(np.concatenate(fbanks))
