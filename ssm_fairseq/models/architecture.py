"""Helpers for fairseq architecture functions."""
from fairseq.utils import safe_getattr


def set_defaults(args, **defaults) -> None:
    """Architecture defaults: keep every value the user set, fill the rest."""
    for name, value in defaults.items():
        setattr(args, name, safe_getattr(args, name, value))
