"""fairseq text models, registered when imported: ``spade_lm`` (SPADE language model), ``spade_transformer``
(SPADE encoder-decoder), ``mssm_roberta`` (MSSM masked LM); ``layer_cache_decoder`` is their incremental decoding."""
from . import mssm_roberta, spade_lm, spade_transformer  # noqa: F401
