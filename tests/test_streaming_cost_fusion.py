"""The benchmarks of fusion's cost. ``scripts/benchmarks/streaming_cost.py`` with a language model: ``--lm-path``
fuses it into the measured stream, ``--compare-lm`` measures a plain and a fused stream over the same chunks and sets
them side by side. ``scripts/benchmarks/lm_fusion_speed.py``: its offline and streaming tables, each search plain and
fused in a child process. On the tiny causal model of ``test_streaming_transcriber`` and a tiny ``spade_lm`` trained
here over its dictionary (a few seconds). No time is asserted; the rows, the side-by-side table, the stream lines
and what each row counted are."""
from __future__ import annotations

import importlib.util
import re

import pytest

from cli import BIN, REPO, run_ok
from test_streaming_transcriber import causal  # noqa: F401  (the trained tiny causal model's fixture)
from test_transcribe import _one_thread, train_language_models  # noqa: F401  (_one_thread: autouse)

pytestmark = pytest.mark.slow

PARTS = ["recognizer, end to end (accept_waveform)", "features", "encoder (MSSM, state carried)",
         "search, endpoints, segments' words", "text (partial transcript)"]
REFERENCE = "reference: causal transformer, key/value cache capped at 10 s (encoder only)"


@pytest.fixture(scope="module")
def spade_lm(causal, tmp_path_factory):
    """A ``spade_lm`` checkpoint over the causal model's dictionary, 10 updates on its training transcripts (as the
    recipe prepares an LM's text: ``scripts/prepare_lm_text.py``)."""
    data, _, _ = causal
    return train_language_models(data, tmp_path_factory.mktemp("lm"), ["spade_lm"])["spade_lm"]


def streaming_cost(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "scripts/benchmarks"))  # its measurement helpers, as when run as a script
    spec = importlib.util.spec_from_file_location("streaming_cost", REPO / "scripts/benchmarks/streaming_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table_rows(out: str) -> list[str]:
    return [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ") and "---" not in line]


@pytest.mark.parametrize("search", ("exact", "modified"))
def test_compare_lm_measures_a_plain_and_a_fused_stream_side_by_side(causal, spade_lm, capsys, monkeypatch, search):
    data, checkpoint, files = causal
    arguments = ["--checkpoint", str(checkpoint), "--corpus-root", str(files[0].parents[3]), "--minutes", "0.05",
                 "--beam", "2", "--search", search, "--pause-seconds", "0.5", "--lm-path", str(spade_lm),
                 "--lm-weight", "0.5"]
    assert streaming_cost(monkeypatch).main([*arguments, "--compare-lm"]) == 0
    out = capsys.readouterr().out
    assert f"beam 2, {search} search; plain and fused with {spade_lm} at weight 0.5" in out
    rows = table_rows(out)
    header = rows.index("ms per 320 ms chunk, CPU median (wall median)")
    assert rows[1:header] == [f"plain: {part}" for part in PARTS] + [f"fused: {part}" for part in PARTS] + [REFERENCE]
    assert rows[header + 1:] == PARTS
    side_by_side = out.split("fused / plain |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    assert len(side_by_side) == len(PARTS)
    for line in side_by_side:  # plain, fused, fused / plain for minute 1 and for the last
        cells = [cell.strip() for cell in line.split("|")[2:-1]]
        assert len(cells) == 6 and cells[2].endswith("x") and cells[5].endswith("x")
    assert "stream plain at the end:" in out and "stream fused at the end:" in out
    assert "word edits between their transcripts" in out


def test_lm_path_alone_measures_one_fused_stream(causal, spade_lm, capsys, monkeypatch):
    data, checkpoint, files = causal
    assert streaming_cost(monkeypatch).main([
        "--checkpoint", str(checkpoint), "--corpus-root", str(files[0].parents[3]), "--minutes", "0.02", "--beam",
        "1", "--lm-path", str(spade_lm), "--lm-weight", "0.5"]) == 0
    out = capsys.readouterr().out
    assert f"greedy search; fused with {spade_lm} at weight 0.5" in out and "plain and fused" not in out
    assert table_rows(out)[1:] == PARTS + [REFERENCE]


def test_compare_lm_without_an_lm_is_refused(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        streaming_cost(monkeypatch).main(["--compare-lm"])
    assert "--compare-lm and --ilm-path need --lm-path" in capsys.readouterr().err


def test_lm_fusion_speed_prints_an_offline_and_a_streaming_row_that_agree(causal, spade_lm):
    """Both tables' greedy rows on the causal model's 4 test-mini utterances (streaming all 4): every cell a number,
    the fused passes stepped the LM, and each table's plain and fused WER are the other's (the causal model streams
    as it decodes offline)."""
    data, checkpoint, _ = causal
    # weight 0.05: at 0.5 the tiny model's fused greedy search emits nothing, and its only LM call is the start's
    out = run_ok([str(BIN / "python"), "scripts/benchmarks/lm_fusion_speed.py", "--checkpoint", str(checkpoint),
                  "--data", str(data), "--lm-path", str(spade_lm), "--lm-weight", "0.05", "--searches", "greedy",
                  "--repeats", "1", "--threads", "1", "--skip-memory", "--stream-utterances", "4"])
    number, ratio, pair = r"[0-9.]+", r"[0-9.]+x", r"[0-9.]+ / [0-9.]+"
    row = re.compile(rf"^\| greedy \| ({number}) \| ({number}) \| {ratio} \| {pair} \| {ratio} \| (\d+) "
                     rf"\| not measured \| ({pair}) \|$")
    streaming_header = "| search (streaming, 320 ms chunks, 4 utterances one at a time) |"
    assert "| search (batched) |" in out and streaming_header in out, out
    found = []
    for part in out.split(streaming_header):
        rows = [line for line in part.splitlines() if line.startswith("| ") and not line.startswith("| search")]
        assert len(rows) == 1 and row.match(rows[0]), out  # only the search asked for, its cells numbers
        found.append(row.match(rows[0]).groups())
    (plain_cost, fused_cost, lm_calls, wer), (*_, streamed_wer) = found
    assert float(plain_cost) > 0 and float(fused_cost) > 0 and int(lm_calls) > 1, found
    assert wer == streamed_wer, found
