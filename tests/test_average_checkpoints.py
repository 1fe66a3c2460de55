"""scripts/average_checkpoints.py refuses checkpoints of different models and an output that is one of its inputs,
naming the files, and creates a missing output directory.

The checkpoints: test_checkpoint_integrity's two epochs of TINY_MODEL, copied and edited (a configuration field
changed, a tensor reshaped) into directories of their own.
"""
from __future__ import annotations

import importlib.util
import logging
import shutil
import sys
from pathlib import Path

import pytest
import torch

from cli import REPO
from test_checkpoint_integrity import edited, trained  # noqa: F401  (the module fixture)


def average_main(argv: list[str]) -> int:
    spec = importlib.util.spec_from_file_location("average_checkpoints", REPO / "scripts/average_checkpoints.py")
    module = sys.modules["average_checkpoints"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def copied(checkpoints: Path, target: Path) -> Path:
    target.mkdir()
    for name in ("checkpoint1.pt", "checkpoint2.pt"):
        shutil.copy(checkpoints / name, target / name)
    return target


def test_another_configuration_is_refused_naming_both_files(trained, tmp_path, caplog):
    """``--ssm-gating gelu`` and ``ihg`` models: fairseq's own average would broadcast their tensors."""
    _, checkpoints = trained
    directory = copied(checkpoints, tmp_path / "mixed")
    edited(directory / "checkpoint2.pt", directory / "checkpoint2.pt",
           lambda state: state["cfg"]["model"].update(ssm_gating="gelu"))
    with caplog.at_level(logging.ERROR):
        assert average_main(["--checkpoint-dir", str(directory), "--last", "2", "--output",
                             str(tmp_path / "avg.pt")]) == 1
    assert (f"{directory}/checkpoint2.pt holds another model than {directory}/checkpoint1.pt: ssm_gating: 'ihg' in "
            f"{directory}/checkpoint1.pt, 'gelu' in {directory}/checkpoint2.pt") in caplog.text
    assert not (tmp_path / "avg.pt").exists()


def test_another_shape_is_refused_naming_the_parameter_and_files(trained, tmp_path, caplog):
    _, checkpoints = trained
    directory = copied(checkpoints, tmp_path / "shapes")
    name = next(n for n, value in torch.load(directory / "checkpoint2.pt", weights_only=False)["model"].items()
                if value.dim() == 2)

    def reshape(state):
        state["model"][name] = torch.zeros(state["model"][name].shape[0] + 1, state["model"][name].shape[1])

    edited(directory / "checkpoint2.pt", directory / "checkpoint2.pt", reshape)
    with caplog.at_level(logging.ERROR):
        assert average_main(["--checkpoint-dir", str(directory), "--last", "2", "--output",
                             str(tmp_path / "avg.pt")]) == 1
    assert f"{directory}/checkpoint2.pt: parameter {name} has shape (" in caplog.text
    assert f"in {directory}/checkpoint1.pt: not the same architecture" in caplog.text


def test_output_that_is_an_input_is_refused_and_a_missing_directory_is_created(trained, tmp_path, caplog):
    _, checkpoints = trained
    directory = copied(checkpoints, tmp_path / "inputs")
    before = (directory / "checkpoint2.pt").read_bytes()
    with caplog.at_level(logging.ERROR):
        assert average_main(["--checkpoint-dir", str(directory), "--last", "2", "--output",
                             str(directory / "../inputs/checkpoint2.pt")]) == 1
    assert f"--output {directory}/../inputs/checkpoint2.pt is one of the checkpoints averaged" in caplog.text
    assert (directory / "checkpoint2.pt").read_bytes() == before
    output = tmp_path / "not/yet/avg.pt"
    assert average_main(["--checkpoint-dir", str(directory), "--last", "2", "--output", str(output)]) == 0
    states = [torch.load(path, weights_only=False)["model"] for path in (directory / "checkpoint1.pt",
                                                                         directory / "checkpoint2.pt", output)]
    name = next(n for n, value in states[0].items() if value.is_floating_point())
    assert torch.allclose(states[2][name], (states[0][name] + states[1][name]) / 2)
