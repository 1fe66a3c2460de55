"""A ``speech_transducer`` checkpoint loaded for recognition, with the data directory it names checked: its
``config.yaml``, the dictionary of SentencePiece units, and features the recognizer can compute."""
from __future__ import annotations

from pathlib import Path

from fairseq import checkpoint_utils
from fairseq.data.audio.data_cfg import S2TDataConfig

from .features.audio_features import NUM_MEL_BINS


def load_checkpoint(checkpoint: Path | str, data_dir: Path | str | None = None, **task_overrides) -> dict:
    """A ``speech_transducer`` checkpoint's state (on CPU), its task config pointing at a data directory that
    holds ``config.yaml`` and the dictionary of SentencePiece units it names (the units' strings are all that
    decoding needs: the SentencePiece model itself is not read).

    ``data_dir`` replaces the checkpoint's ``data``; ``task_overrides`` set other task options (the search's).
    Raises ``FileNotFoundError`` naming the first missing file, ``ValueError`` for a checkpoint of another task.
    """
    if not Path(checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint not found: {checkpoint}")
    overrides = dict(task_overrides, **({"data": str(data_dir)} if data_dir is not None else {}))
    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint), arg_overrides=overrides)
    task_cfg = state["cfg"].task
    task_name = getattr(task_cfg, "_name", None)
    if task_name != "speech_transducer":
        raise ValueError(f"{checkpoint}: a checkpoint of --task {task_name}; transcription needs a "
                         f"--task speech_transducer checkpoint")
    root = Path(task_cfg.data)
    where = ("(--data-dir)" if data_dir is not None else
             "(the checkpoint's data directory; pass --data-dir if the data has moved)")
    config = root / task_cfg.config_yaml
    if not config.is_file():
        raise FileNotFoundError(f"{config}: config not found {where}")
    data_cfg = S2TDataConfig(config)
    dictionary = root / data_cfg.vocab_filename
    if not dictionary.is_file():
        raise FileNotFoundError(f"{dictionary}: the dictionary {config} names, not found {where}")
    if data_cfg.bpe_tokenizer.get("bpe") != "sentencepiece":
        raise ValueError(f"{config}: transcription turns SentencePiece units into words; this config's "
                         f"bpe_tokenizer is {data_cfg.bpe_tokenizer}")
    model_input = ("waveforms (use_audio_input)" if data_cfg.use_audio_input
                   else f"{data_cfg.input_feat_per_channel}-dim features (input_feat_per_channel)")
    if data_cfg.use_audio_input or data_cfg.input_feat_per_channel != NUM_MEL_BINS:
        raise ValueError(f"{config}: the model reads {model_input}; transcription computes the "
                         f"{NUM_MEL_BINS}-dim filterbanks of scripts/prepare_librispeech.py")
    return state
