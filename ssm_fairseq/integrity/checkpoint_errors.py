"""The errors that refuse a checkpoint (``checkpoint_checks``), in a module of their own so that models can raise
them without importing the checks (which import the models)."""


class CheckpointError(ValueError):
    """A checkpoint that must not be used: corrupted bytes, non-finite weights, another model configuration."""


class DictionaryMismatchError(CheckpointError):
    """A model trained with other dictionary files than those it is given (its labels mean other units)."""


class FeatureMismatchError(CheckpointError):
    """A model given other features than it was trained on (another CMVN, other global CMVN statistics, other
    feature transforms or width): it would transcribe garbage."""
