"""Transducer search for ``fairseq-generate``: batched greedy and beam search over the RNN-T lattice.

``Hypothesis`` and ``TransducerGenerator`` are importable from here, imported on first use (PEP 562) so that the
torch-free module here (``word_timestamps``, which the ONNX Runtime recognizer of ``ssm_fairseq.deploy`` and the
command line's outputs use) imports without torch. The search functions come from their modules:
``from ssm_fairseq.asr.search.beam_search import beam_search`` (``greedy_search`` likewise); the package's names
``beam_search`` and ``greedy_search`` are those modules.
"""
import importlib

_EXPORTED = {"Hypothesis": "hypothesis", "TransducerGenerator": "transducer_generator"}

__all__ = sorted(_EXPORTED)


def __getattr__(name: str):
    """``Hypothesis`` and ``TransducerGenerator``, each imported from its module on first use."""
    if name not in _EXPORTED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTED[name]}"), name)
