"""Helpers for fairseq architecture functions and model configurations."""
from __future__ import annotations

import dataclasses
import logging

from fairseq.utils import safe_getattr
from omegaconf import DictConfig, open_dict

logger = logging.getLogger(__name__)


def set_defaults(args, **defaults) -> None:
    """Architecture defaults: keep every value the user set, fill the rest."""
    for name, value in defaults.items():
        setattr(args, name, safe_getattr(args, name, value))


def config_defaults(config_class) -> dict:
    """``{field: default}`` of a model's dataclass configuration, without fields that have no default or whose
    default refers to another part of the configuration (``${...}``)."""
    defaults = {}
    for field in dataclasses.fields(config_class):
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            continue
        if not (isinstance(value, str) and value.startswith("${")):
            defaults[field.name] = value
    return defaults


def registered_config_defaults(name: str | None) -> dict:
    """``config_defaults`` of the dataclass of the model or architecture registered as ``name`` (``{}`` when
    there is none: an unknown name, or a model configured by argparse alone)."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    model = ARCH_MODEL_REGISTRY.get(name) or MODEL_REGISTRY.get(name)
    config_class = getattr(model, "__dataclass", None)
    return config_defaults(config_class) if dataclasses.is_dataclass(config_class) else {}


def fill_config_defaults(cfg, config_class) -> None:
    """Give ``cfg`` (a ``DictConfig`` or ``argparse.Namespace``) every field of the dataclass ``config_class`` it
    lacks, at the field's default.

    A checkpoint saved by an earlier release stores the model configuration of that release; fairseq fills new
    fields from the dataclass only for a model's registered name, not for an architecture name (``--arch
    mssm_transducer``), so without this a field added since (``--causal-encoder``, say) would be missing and the
    checkpoint would not load. Fields whose default refers to another part of the configuration (``${...}``) are
    left alone.
    """
    missing = {name: value for name, value in config_defaults(config_class).items()
               if not (name in cfg if isinstance(cfg, DictConfig) else hasattr(cfg, name))}
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
