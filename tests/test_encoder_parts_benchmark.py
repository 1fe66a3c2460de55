"""``encoder_parts.py`` runs end to end at a tiny batch: a row per mode and architecture, each whole time its
sub-sampler's plus the rest, the reference's ratios 1.00x (times are printed, never asserted)."""
import runpy
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "benchmarks" / "encoder_parts.py"
ARCHITECTURES = ("mssm_transducer", "transformer_transducer")


def test_encoder_parts_prints_each_architectures_parts_per_mode(monkeypatch, capsys, worker_threads):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # as `python SCRIPT` does
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--architectures", *ARCHITECTURES, "--max-tokens", "300",
                                      "--seconds", "0.5", "--repeats", "1", "--device", "cpu", *worker_threads])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out
    assert "# Encoder time by part: 6 utterances of 0.45-0.5 s (--max-tokens 300)" in out, out
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| mode")]
    assert [tuple(row[:2]) for row in rows] == [(mode, a) for mode in ("eval", "train") for a in ARCHITECTURES]
    for mode, architecture, whole, sub_and_share, rest, *ratios in rows:
        sub, share = sub_and_share.split()
        assert float(whole) > 0 and float(sub) > 0 and float(rest) > 0, (mode, architecture)
        assert float(sub) + float(rest) == pytest.approx(float(whole), abs=0.2)  # each printed to 0.1 ms
        assert share.startswith("(") and share.endswith("%)") and 0 <= int(share[1:-2]) < 100
        assert all(ratio.endswith("x") for ratio in ratios)
        if architecture == ARCHITECTURES[-1]:
            assert ratios == ["1.00x"] * 3


def test_an_unregistered_architecture_is_refused_before_anything_runs(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--architectures", "mssm_transducer", "transformer_lm"])
    with pytest.raises(SystemExit):
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert "not registered transducer architectures: ['transformer_lm']" in capsys.readouterr().err


def test_a_sub_sampler_timed_longer_than_its_encoder_prints_no_row(monkeypatch, capsys):
    """At a batch so small that timing noise exceeds the layers' time, "the rest" would be negative: the script
    fails naming the mode and architecture instead of printing it."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import measurement

    times = {"mssm_transducer": {"eval": {"encoder": 10.0, "sub-sampler": 11.0}},
             "transformer_transducer": {"eval": {"encoder": 10.0, "sub-sampler": 1.0}}}
    monkeypatch.setattr(measurement, "child", lambda script, args: times[args[1]])
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--architectures", *ARCHITECTURES, "--modes", "eval"])
    with pytest.raises(SystemExit, match=r"eval: the sub-sampler alone measured at least the whole encoder for "
                                         r"\['mssm_transducer'\]"):
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert "| eval |" not in capsys.readouterr().out
