"""Transducer search for ``fairseq-generate``: batched greedy and beam search over the RNN-T lattice."""
from .beam_search import beam_search  # noqa: F401
from .greedy_search import greedy_search  # noqa: F401
from .hypothesis import Hypothesis  # noqa: F401
from .transducer_generator import TransducerGenerator  # noqa: F401
