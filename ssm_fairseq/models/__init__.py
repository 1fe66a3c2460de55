"""fairseq models: importing this registers them."""
from . import mssm_roberta, spade_lm, spade_transformer, transducer  # noqa: F401
