"""fairseq models: importing this registers them."""
from . import transducer  # noqa: F401
