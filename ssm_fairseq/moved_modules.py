"""The import paths of the modules this release moved, kept working for one release (see CHANGELOG.md).

The package was laid out by domain (``layers/``, ``asr/``, ``text/``, ``integrity/``; ``docs/layout.md``). An import of
an old path (``ssm_fairseq.modules.speech_encoder``, ``ssm_fairseq.models.transducer``, ...) gets the module at its
new path, the same module object (one registration with fairseq, one class per name), with a ``DeprecationWarning``
naming the new path. ``MOVED`` maps old to new names, relative to the package.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType

PACKAGE = __name__.rpartition(".")[0]

MOVED = {
    "audio_features": "asr.features.audio_features",
    "checkpoint_checks": "integrity.checkpoint_checks",
    "checkpoint_errors": "integrity.checkpoint_errors",
    "vocabulary_fingerprint": "integrity.vocabulary_fingerprint",
    "data_config": "asr.transducer.data_config",
    "modules": "layers",
    "modules.multihead_ssm": "layers.state_space.multihead_ssm",
    "modules.bidirectional_ssm": "layers.state_space.bidirectional_ssm",
    "modules.causal_ssm": "layers.state_space.causal_ssm",
    "modules.ssm_ablation": "layers.state_space.ssm_ablation",
    "modules.self_attention": "layers.attention.self_attention",
    "modules.local_attention": "layers.attention.local_attention",
    "modules.cross_attention": "layers.attention.cross_attention",
    "modules.relative_position": "layers.attention.relative_position",
    "modules.dropout": "layers.dropout",
    "modules.feed_forward": "layers.feed_forward",
    "modules.recompute": "layers.recompute",
    "modules.encoder_layer": "layers.encoder_layer",
    "modules.conformer_convolution": "layers.conformer_convolution",
    "modules.spade_layer": "layers.spade_layer",
    "modules.speech_encoder": "asr.encoder.speech_encoder",
    "modules.subsampling": "asr.encoder.subsampling",
    "modules.predictor": "asr.transducer.predictor",
    "modules.joiner": "asr.transducer.joiner",
    "modules.rnnt_loss": "asr.transducer.rnnt_loss",
    "modules.pruned_rnnt_loss": "asr.transducer.pruned_rnnt_loss",
    "models": "text",
    "models.transducer": "asr.transducer.model",
    "models.architecture": "architecture",
    "models.dictionary_digest": "integrity.dictionary_digest",
    "models.task_check": "integrity.task_check",
    "models.spade_lm": "text.spade_lm",
    "models.spade_transformer": "text.spade_transformer",
    "models.mssm_roberta": "text.mssm_roberta",
    "models.layer_cache_decoder": "text.layer_cache_decoder",
    "criterions": "asr.transducer",
    "criterions.transducer": "asr.transducer.criterion",
    "tasks": "asr.transducer",
    "tasks.speech_transducer": "asr.transducer.task",
    "tasks.seeded_items": "asr.transducer.seeded_items",
    "tasks.feature_check": "integrity.feature_check",
    "tasks.manifest_check": "integrity.manifest_check",
    "generation": "asr.search",
    "generation.beam_search": "asr.search.beam_search",
    "generation.greedy_search": "asr.search.greedy_search",
    "generation.hypothesis": "asr.search.hypothesis",
    "generation.lm_fusion": "asr.search.lm_fusion",
    "generation.transducer_generator": "asr.search.transducer_generator",
    "generation.word_timestamps": "asr.search.word_timestamps",
    "generation.language_model_check": "integrity.language_model_check",
    "streaming": "asr",
    "streaming.filterbank": "asr.features.filterbank",
    "streaming.transcriber": "asr.streaming_transcriber",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new path: ``sys.modules[old]`` becomes that module (the import system
    returns what ``sys.modules`` holds after ``exec_module``), whose own ``__spec__`` and ``__name__`` stay its own."""

    def __init__(self, new_name: str):
        self.new_name = new_name

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the default placeholder, replaced in exec_module

    def exec_module(self, module: ModuleType) -> None:
        sys.modules[module.__name__] = importlib.import_module(self.new_name)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old names of ``MOVED``; every other name is left to the other finders."""

    def find_spec(self, fullname: str, path=None, target=None) -> ModuleSpec | None:
        old = fullname[len(PACKAGE) + 1:] if fullname.startswith(PACKAGE + ".") else None
        if old not in MOVED:
            return None
        new_name = f"{PACKAGE}.{MOVED[old]}"
        warnings.warn(f"{fullname} moved to {new_name}; the old path will be removed in the next release",
                      DeprecationWarning, stacklevel=2)
        return importlib.util.spec_from_loader(fullname, _Alias(new_name))


def install() -> None:
    """Put ``MovedModuleFinder`` first on ``sys.meta_path`` (once per process)."""
    if not any(type(finder).__name__ == MovedModuleFinder.__name__ for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())  # before the path finder: it would load
        # an old name's file a second time where the new package holds a file of that name (``modules.dropout``)
