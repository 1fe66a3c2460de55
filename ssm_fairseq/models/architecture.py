"""Helpers for fairseq architecture functions and model configurations."""
import dataclasses
import logging

from fairseq.utils import safe_getattr
from omegaconf import DictConfig, open_dict

logger = logging.getLogger(__name__)


def set_defaults(args, **defaults) -> None:
    """Architecture defaults: keep every value the user set, fill the rest."""
    for name, value in defaults.items():
        setattr(args, name, safe_getattr(args, name, value))


def fill_config_defaults(cfg, config_class) -> None:
    """Give ``cfg`` (a ``DictConfig`` or ``argparse.Namespace``) every field of the dataclass ``config_class`` it
    lacks, at the field's default.

    A checkpoint saved by an earlier release stores the model configuration of that release; fairseq fills new
    fields from the dataclass only for a model's registered name, not for an architecture name (``--arch
    mssm_transducer``), so without this a field added since (``--causal-encoder``, say) would be missing and the
    checkpoint would not load. Fields whose default refers to another part of the configuration (``${...}``) are
    left alone.
    """
    missing = {}
    for field in dataclasses.fields(config_class):
        if hasattr(cfg, field.name) if not isinstance(cfg, DictConfig) else field.name in cfg:
            continue
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            continue
        if isinstance(value, str) and value.startswith("${"):
            continue
        missing[field.name] = value
    if not missing:
        return
    logger.info(f"model configuration without {', '.join(missing)} (saved by an earlier release): using the "
                f"defaults {missing}")
    if isinstance(cfg, DictConfig):
        with open_dict(cfg):
            for name, value in missing.items():
                cfg[name] = value
    else:
        for name, value in missing.items():
            setattr(cfg, name, value)
