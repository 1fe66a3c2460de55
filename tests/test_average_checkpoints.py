"""scripts/average_checkpoints.py refuses checkpoints of different models, an output that is one of its inputs and an
output named as fairseq-train's own checkpoints (which would replace the resume state), naming the files; it creates
a missing output directory and writes through a temporary file, so a failed write leaves the old output.

The checkpoints: test_checkpoint_integrity's two epochs of TINY_MODEL, copied and edited (a configuration field
changed, a tensor reshaped) into directories of their own.
"""
from __future__ import annotations

import importlib.util
import logging
import shutil
import subprocess
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
    assert [path.name for path in output.parent.iterdir()] == ["avg.pt"]  # no temporary file left


def test_an_output_named_as_fairseq_train_checkpoints_is_refused(trained, tmp_path):
    """``--output DIR/checkpoint_last.pt`` replaced the resume state with the average (no optimizer state, its
    updates count gone): the next ``fairseq-train --max-update 620`` trained 620 updates instead of 20."""
    _, checkpoints = trained
    directory = copied(checkpoints, tmp_path / "run")
    shutil.copy(checkpoints / "checkpoint_last.pt", directory / "checkpoint_last.pt")
    before = {path.name: path.read_bytes() for path in directory.iterdir()}
    result = subprocess.run([sys.executable, "-m", "ssm_fairseq.cli.average_checkpoints", "--checkpoint-dir",
                             str(directory), "--last", "2", "--output", str(directory / "checkpoint_last.pt")],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 1, result.stderr
    assert (f"--output {directory}/checkpoint_last.pt: checkpoint_last.pt is a name fairseq-train writes and resumes "
            f"from in a checkpoint directory") in result.stderr
    assert f"pick another name (e.g. {directory}/checkpoint_avg2.pt)" in result.stderr
    assert {path.name: path.read_bytes() for path in directory.iterdir()} == before


@pytest.mark.parametrize("name", ["checkpoint_best.pt", "checkpoint7.pt", "checkpoint_3_620.pt",
                                  "checkpoint.best_loss_4.210.pt", "checkpoint_last-shard0.pt", "link.pt"])
def test_every_fairseq_checkpoint_name_is_refused(tmp_path, caplog, name):
    """Names fairseq-train writes, resumes from or deletes (``--keep-last-epochs``), with a suffix too, and a link
    to one; nothing is read before the output is checked, so empty files do."""
    for epoch in (1, 2):
        (tmp_path / f"checkpoint{epoch}.pt").touch()
    (tmp_path / "checkpoint_last.pt").touch()
    (tmp_path / "link.pt").symlink_to(tmp_path / "checkpoint_last.pt")
    with caplog.at_level(logging.ERROR):
        assert average_main(["--checkpoint-dir", str(tmp_path), "--last", "2", "--output", str(tmp_path / name)]) == 1
    assert "is a name fairseq-train writes and resumes from in a checkpoint directory" in caplog.text


def test_a_failed_write_leaves_the_old_output(trained, tmp_path, caplog, monkeypatch):
    _, checkpoints = trained
    directory = copied(checkpoints, tmp_path / "inputs")
    output = tmp_path / "out/checkpoint_avg2.pt"
    assert average_main(["--checkpoint-dir", str(directory), "--last", "2", "--output", str(output)]) == 0
    before = output.read_bytes()

    def disk_full(state, path):
        Path(path).write_bytes(b"PK\x03\x04 half a checkpoint")
        raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file")

    monkeypatch.setattr(torch, "save", disk_full)
    with caplog.at_level(logging.ERROR):
        assert average_main(["--checkpoint-dir", str(directory), "--last", "2", "--output", str(output)]) == 1
    assert f"--output {output}: could not write the average (" in caplog.text
    assert output.read_bytes() == before and [path.name for path in output.parent.iterdir()] == [output.name]
