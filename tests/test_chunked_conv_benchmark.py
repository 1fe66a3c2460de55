"""``chunked_conv.py --layer`` measures what it says: an ``mssm_transducer`` encoder layer whose convolutions run the
way asked (FFT of generated kernels, or chunk by chunk), in training and in inference (times are never asserted)."""
import argparse
from pathlib import Path

import pytest

from ssm_fairseq.layers.state_space import multihead_ssm
from ssm_fairseq.ssm import batched_kernels, chunked_conv

SCRIPT_DIR = Path(__file__).resolve().parents[1] / "scripts" / "benchmarks"


@pytest.mark.parametrize("way", ["fft", "chunked"])
def test_the_layer_runs_its_convolutions_the_way_asked(way, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT_DIR))
    # the measurement sets these module globals for its own process: restored after the test
    monkeypatch.setattr(batched_kernels, "CHUNKED_MIN_POSITIONS", batched_kernels.CHUNKED_MIN_POSITIONS)
    monkeypatch.setattr(chunked_conv, "chunk_length", chunked_conv.chunk_length)
    import chunked_conv as script  # scripts/benchmarks/chunked_conv.py

    calls = {"chunked": 0}
    for name in ("chunk_convolution", "convolve_batch_first"):  # inference's channels-first path, training's
        monkeypatch.setattr(multihead_ssm, name, lambda *a, inner=getattr(multihead_ssm, name), **k:
                            calls.__setitem__("chunked", calls["chunked"] + 1) or inner(*a, **k))
    for mode in ("train", "infer"):
        calls["chunked"] = 0
        args = argparse.Namespace(way=way, chunk=4 if way == "chunked" else None, length=12, batch=2, mode=mode,
                                  device="cpu", repeats=1, what="time")
        result = script.measure_layer(args)
        assert result["seconds"] > 0
        if way == "chunked":  # each direction's stages, chunks of the asked length
            assert calls["chunked"] > 0, mode
            assert chunked_conv.chunk_length(1000, 10) == 4
        else:  # the layer's stages run both ways in one two-way FFT convolution (not through convolve), never chunked
            assert calls["chunked"] == 0, mode
