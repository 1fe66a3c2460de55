"""ssm_fairseq: state space models (S4, S4D, DSS, MSSM) for fairseq.

``fairseq-train --user-dir ssm_fairseq`` imports this package, which imports the subpackages that register
components with fairseq (``models``, ``criterions``, ``tasks``, ``optim``). The SSM kernels in
``ssm_fairseq.ssm`` and the layers in ``ssm_fairseq.modules`` need only torch: without fairseq installed, the
package imports them alone. With fairseq, ``checkpoint_checks`` also makes fairseq's checkpoint reader check every
checkpoint (CRCs, finite weights, the model configuration of a resumed run) and name the file it fails on.
"""
import importlib.util

if importlib.util.find_spec("fairseq") is not None:
    from . import checkpoint_checks, criterions, models, optim, tasks  # noqa: F401
from . import ssm  # noqa: F401

__version__ = "0.1.0"
