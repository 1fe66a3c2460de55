"""How a ``Recognizer`` decodes: the search, batching and precision settings, checked once, and the device.

Imports no torch at module level (``choose_device`` and ``PRECISIONS`` import it when used), so that the command
line can parse and check its options before it knows whether it needs torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .windowing import Windowing

if TYPE_CHECKING:
    import torch

DEFAULT_MAX_TOKENS = 12000  # fairseq-generate's when neither --max-tokens nor --batch-size is given
PRECISION_NAMES = ("float32", "float16", "bfloat16")  # each the name of a torch dtype
SEARCHES = ("exact", "modified")  # the speech_transducer task's --search choices
# Labels a hypothesis may emit within one encoder frame before the search moves it to the next frame. High enough
# never to bind on a trained model (torchaudio's default too); it only bounds the work on an untrained one.
MAX_SYMBOLS_PER_FRAME = 100


def __getattr__(name: str):
    """``PRECISIONS``: precision name -> torch dtype, imported on first use (PEP 562)."""
    if name == "PRECISIONS":
        import torch
        return {precision: getattr(torch, precision) for precision in PRECISION_NAMES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def precision_dtype(precision: str) -> torch.dtype:
    """The torch dtype of a ``PRECISION_NAMES`` name."""
    import torch
    return getattr(torch, precision)


@dataclass(frozen=True)
class DecodingOptions:
    """A ``Recognizer``'s settings (the arguments ``Transcriber`` and ``ssm-transcribe`` take).

    Args:
        beam: 1 for greedy search, more for beam search (default 4, as the recipe decodes).
        search: ``"exact"`` (frame-synchronous, up to ``max_symbols_per_frame`` labels per frame) or
            ``"modified"`` (one label per frame).
        max_symbols_per_frame, blank_penalty, lenpen: as ``fairseq-generate``'s ``--max-symbols-per-frame``,
            ``--blank-penalty`` and ``--lenpen``.
        max_tokens: most feature frames (10 ms each) in a padded batch of files; default 12000, as
            ``fairseq-generate``, unless ``batch_size`` alone is given.
        batch_size: most files in a batch.
        precision: ``"float32"``, ``"float16"`` or ``"bfloat16"``: the dtype the model decodes in, as
            ``fairseq-generate --fp16`` / ``--bf16`` (the joiner's log-softmax and the scores stay float32).
        lm_path, lm_weight, lm_eos: shallow fusion with a fairseq language model, as ``fairseq-generate --lm-path
            --lm-weight`` (and ``--no-lm-eos`` for ``lm_eos=False``); the LM stays in float32.
        ilm_path, ilm_weight: LODR, as ``fairseq-generate --ilm-path --ilm-weight``: the bigram of the training
            transcripts (``scripts/build_bigram.py``) whose weighted log-probability each emitted unit loses;
            ``ilm_weight`` above 0 needs ``ilm_path`` and a fused LM (``lm_path``, ``lm_weight`` above 0).
        window_seconds, window_context_seconds, window_cmvn: files longer than ``window_seconds`` are transcribed
            offline in windows of that length, keeping each window's centre between ``window_context_seconds`` of
            context on each side; utterance CMVN per window or over the file (``windowing.Windowing``).
        pause_seconds: if positive, offline transcription cuts every file where its audio pauses at least this long
            and decodes the pieces as utterances (``windowing.Windowing``, ``pause_segments``); 0: off. A stream
            is cut at its pauses by ``EndpointRules(pause_seconds=...)`` (``ssm-transcribe --stream
            --split-at-pauses``).
        cmvn_stats: global CMVN statistics (a ``gcmvn.npz``: ``mean`` and ``std`` per bin) to normalise with in
            place of the data directory's CMVN (global, utterance or adaptive): a model trained on utterance CMVN
            decoded with its training set's global statistics. None: the config's CMVN.
        cmvn_adapt_frames: streaming-adaptive CMVN (``features.adaptive_cmvn``): after global CMVN (``cmvn_stats``',
            else the config's), each frame normalised by the running statistics of its utterance (or stream) up to
            it, pooled with this many frames (``>= 0``) of the training set's; ``inf``: global CMVN alone. None:
            the config's CMVN. ``features.transforms.decoding_transforms`` applies both.

    Raises ``ValueError`` naming the first option out of its range.
    """

    beam: int = 4
    search: str = "exact"
    max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME
    lenpen: float = 1.0
    blank_penalty: float = 0.0
    max_tokens: int | None = None
    batch_size: int | None = None
    precision: str = "float32"
    lm_path: Path | str | None = None
    lm_weight: float = 0.0
    lm_eos: bool = True
    ilm_path: Path | str | None = None
    ilm_weight: float = 0.0
    window_seconds: float = Windowing.window_seconds
    window_context_seconds: float = Windowing.window_context_seconds
    window_cmvn: str = Windowing.window_cmvn
    pause_seconds: float = Windowing.pause_seconds
    cmvn_stats: Path | str | None = None
    cmvn_adapt_frames: float | None = None

    def __post_init__(self):
        for name in ("beam", "max_symbols_per_frame", "max_tokens", "batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.search not in SEARCHES:
            raise ValueError(f"search must be one of {SEARCHES}, got {self.search!r}")
        if self.precision not in PRECISION_NAMES:
            raise ValueError(f"precision must be one of {sorted(PRECISION_NAMES)}, got {self.precision!r}")
        if not math.isfinite(self.ilm_weight) or self.ilm_weight < 0:
            raise ValueError(f"ilm_weight must be a finite number >= 0, got {self.ilm_weight}")
        if self.ilm_weight and (self.ilm_path is None or self.lm_path is None or not self.lm_weight):
            raise ValueError(f"ilm_weight {self.ilm_weight} needs ilm_path (the transcripts' bigram) and a fused "
                             f"language model (lm_path, lm_weight above 0): LODR corrects shallow fusion")
        if self.cmvn_adapt_frames is not None and (
                isinstance(self.cmvn_adapt_frames, bool) or not isinstance(self.cmvn_adapt_frames, (int, float))
                or math.isnan(self.cmvn_adapt_frames) or self.cmvn_adapt_frames < 0):
            raise ValueError(f"cmvn_adapt_frames must be a number of frames >= 0 (or inf: global CMVN alone), got "
                             f"{self.cmvn_adapt_frames!r}")
        self.windowing  # ValueError naming the window option out of range

    @property
    def windowing(self) -> Windowing:
        """Where files longer than one window are cut (``long_form``)."""
        return Windowing(self.window_seconds, self.window_context_seconds, self.window_cmvn, self.pause_seconds)

    @property
    def batch_max_tokens(self) -> int | None:
        """``max_tokens`` as batches are cut: ``DEFAULT_MAX_TOKENS`` when neither it nor ``batch_size`` is set."""
        return DEFAULT_MAX_TOKENS if self.max_tokens is None and self.batch_size is None else self.max_tokens

    def describe_search(self) -> str:
        """The search in words, for the log: ``"beam 4, exact search, fused with LM (weight 0.5)"``."""
        searching = "greedy search" if self.beam == 1 else f"beam {self.beam}, {self.search} search"
        if self.lm_path is not None:
            searching += f", fused with {self.lm_path} (weight {self.lm_weight})"
        if self.ilm_weight:
            searching += f", LODR bigram {self.ilm_path} (weight {self.ilm_weight})"
        return searching

    def describe_cmvn(self) -> str | None:
        """The CMVN the options set, in words, for the log (None: the config's): ``"global CMVN (gcmvn.npz), adapted
        with a prior of 300 frames"``."""
        if self.cmvn_stats is None and self.cmvn_adapt_frames is None:
            return None
        stats = self.cmvn_stats or "the statistics config.yaml names"
        described = f"global CMVN ({stats})"
        if self.cmvn_adapt_frames is not None and not math.isinf(self.cmvn_adapt_frames):
            described += f", adapted with a prior of {self.cmvn_adapt_frames:g} frames"
        return described


def choose_device(device: str | torch.device | None) -> torch.device:
    """``device``, by default cuda if available, else cpu; ``ValueError`` for cuda where there is none."""
    import torch
    chosen = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {chosen} asked for, but CUDA is not available here (--cpu decodes on CPU)")
    return chosen
