"""``atomic_files.replacing``: the output changes only when its new content is complete."""
from __future__ import annotations

import pytest

from ssm_fairseq.atomic_files import replacing


def test_a_complete_write_replaces_the_output(tmp_path):
    output = tmp_path / "kernels.png"
    output.write_text("old")
    with replacing(output) as temporary:
        assert temporary.parent == tmp_path and temporary.suffix == ".png" and temporary != output
        temporary.write_text("new")
        assert output.read_text() == "old"  # readers see the old file until the write is complete
    assert output.read_text() == "new" and [path.name for path in tmp_path.iterdir()] == ["kernels.png"]


def test_a_failed_write_leaves_the_old_output_and_no_temporary_file(tmp_path):
    output = tmp_path / "train.txt"
    output.write_text("old")
    with pytest.raises(ValueError, match="half way"):
        with replacing(output) as temporary:
            temporary.write_text("half")
            raise ValueError("half way")
    assert output.read_text() == "old" and [path.name for path in tmp_path.iterdir()] == ["train.txt"]
