"""fairseq models: importing this registers them."""
from . import spade_lm, transducer  # noqa: F401
