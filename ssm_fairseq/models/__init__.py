"""fairseq models: importing this registers them."""
from . import mssm_roberta, spade_lm, transducer  # noqa: F401
