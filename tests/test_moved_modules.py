"""The modules' import paths of the previous release still import, for one release: the same module object as the
new path (one class per name, one fairseq registration), with a DeprecationWarning naming the new path."""
import importlib
import warnings

import pytest

from ssm_fairseq.moved_modules import MOVED


@pytest.mark.parametrize("old,new", sorted(MOVED.items()))
def test_an_old_path_is_the_module_at_its_new_path(old, new):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(f"ssm_fairseq.{old}")
    assert module is importlib.import_module(f"ssm_fairseq.{new}")
    assert module.__name__ == f"ssm_fairseq.{new}"
    assert any(issubclass(w.category, DeprecationWarning) and f"ssm_fairseq.{new}" in str(w.message) for w in caught)


def test_a_name_imported_from_an_old_path_is_the_same_object():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from ssm_fairseq.generation import TransducerGenerator as old_generator
        from ssm_fairseq.models.transducer import TransducerModel as old_model
        from ssm_fairseq.modules.dropout import LeanDropout as old_dropout
    from ssm_fairseq.asr.search import TransducerGenerator
    from ssm_fairseq.asr.transducer.model import TransducerModel
    from ssm_fairseq.layers.dropout import LeanDropout
    assert (old_generator, old_model, old_dropout) == (TransducerGenerator, TransducerModel, LeanDropout)


def test_a_name_never_defined_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ssm_fairseq.modules.no_such_module")
