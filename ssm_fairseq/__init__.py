"""ssm_fairseq: state space models (S4, S4D, DSS, MSSM) for fairseq.

The SSM kernels in ``ssm_fairseq.ssm`` and the layers in ``ssm_fairseq.modules`` need only torch: importing them
(or this package) does not import fairseq. The subpackages that register components with fairseq (``models``,
``criterions``, ``tasks``, ``optim``) are imported, and the package's patches of fairseq applied (``fairseq_patches``:
fairseq's checkpoint reader checks every checkpoint, CRCs, finite weights, the model configuration of a resumed run),
when fairseq is imported (``registration``): at once if fairseq is already imported (``fairseq-train --user-dir
ssm_fairseq`` imports this package after fairseq), otherwise by a small import hook the moment ``import fairseq`` completes, or at the end of the
import of the module of ours that imported fairseq (every ``ssm-*`` command, ``python -m ssm_fairseq.transcribe``).
Either way fairseq's registries hold every component before anything can read them, in whichever order the two
packages are imported. ``registration.register()`` does it by hand.

The package also keeps one fairseq import-time message off the console: fairseq's ``text_to_speech`` task logs
"Please install tensorboardX" at INFO whenever fairseq is imported without tensorboardX (which only its speech
synthesis task uses), so every ``ssm-*`` command, even ``--help``, printed it. The filter on that one logger drops
that one message; every other record of it, and every other logger, is untouched. It is installed here, before
fairseq is imported, not with the patches of ``fairseq_patches``, which import fairseq (and it patches nothing:
``logging.Filter`` is logging's own hook).
"""
import logging

from . import registration, ssm  # noqa: F401

__version__ = "0.1.0"


def _not_the_tensorboardx_hint(record: logging.LogRecord) -> bool:
    """False for fairseq's "Please install tensorboardX" import-time hint, True for every other record."""
    return not record.getMessage().startswith("Please install tensorboardX")


logging.getLogger("fairseq.tasks.text_to_speech").addFilter(_not_the_tensorboardx_hint)
registration.arm()
