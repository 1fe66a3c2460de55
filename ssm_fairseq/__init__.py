"""ssm_fairseq: state space models (S4, S4D, DSS, MSSM) for fairseq.

``fairseq-train --user-dir ssm_fairseq`` imports this package, which imports the subpackages that register
components with fairseq (``models``, ``criterions``, ``tasks``, ``optim``). The SSM kernels in
``ssm_fairseq.ssm`` and the layers in ``ssm_fairseq.modules`` need only torch.
"""
from . import criterions, models, optim, ssm, tasks  # noqa: F401

__version__ = "0.1.0"
