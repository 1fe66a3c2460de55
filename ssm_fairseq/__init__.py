"""ssm_fairseq: state space models (S4, S4D, DSS, MSSM) for fairseq.

``fairseq-train --user-dir ssm_fairseq`` imports this package, which imports the subpackages that register
components with fairseq. The SSM kernels in ``ssm_fairseq.ssm`` need only torch.
"""
from . import ssm  # noqa: F401

__version__ = "0.1.0"
