"""ssm_fairseq: state space models (S4, S4D, DSS, MSSM) for fairseq.

The package is laid out by domain (``docs/layout.md``): ``ssm`` (the SSM kernels) and ``layers`` (the blocks built
on them) need only torch; ``asr`` is speech recognition (features, the speech encoder, the transducer and its fairseq
model, criterion and task, search, recognition of files and streams), ``text`` the text models, ``integrity`` the
checks that refuse silently wrong inputs, ``cli`` the console commands. Importing this package imports neither
torch nor fairseq. The modules that register components with fairseq (``registration.REGISTERING``: the transducer's
model, criterion and task, the text models, the LR scheduler) are imported, and the package's patches of fairseq
applied (``fairseq_patches``: fairseq's checkpoint reader checks every checkpoint, CRCs, finite weights, the model
configuration of a resumed run), when fairseq is imported (``registration``): at once if fairseq is already imported
(``fairseq-train --user-dir ssm_fairseq`` imports this package after fairseq), otherwise by a small import hook the
moment ``import fairseq`` completes, or at the end of the import of the module of ours that imported fairseq (every
``ssm-*`` command, ``python -m ssm_fairseq.transcribe``). Either way fairseq's registries hold every component before
anything can read them, in whichever order the two packages are imported. ``registration.register()`` does it by
hand. The modules' import paths of the previous release still work for one release (``moved_modules``).

The package also keeps one fairseq import-time message off the console: fairseq's ``text_to_speech`` task logs
"Please install tensorboardX" at INFO whenever fairseq is imported without tensorboardX (which only its speech
synthesis task uses), so every ``ssm-*`` command, even ``--help``, printed it. The filter on that one logger drops
that one message; every other record of it, and every other logger, is untouched. It is installed here, before
fairseq is imported, not with the patches of ``fairseq_patches``, which import fairseq (and it patches nothing:
``logging.Filter`` is logging's own hook).
"""
import logging

from . import moved_modules, registration

__version__ = "0.1.0"


def _not_the_tensorboardx_hint(record: logging.LogRecord) -> bool:
    """False for fairseq's "Please install tensorboardX" import-time hint, True for every other record."""
    return not record.getMessage().startswith("Please install tensorboardX")


logging.getLogger("fairseq.tasks.text_to_speech").addFilter(_not_the_tensorboardx_hint)
moved_modules.install()
registration.arm()
