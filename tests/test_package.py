"""The plugin imports as a package and through fairseq's --user-dir, also when torchaudio cannot load; its
torch-only parts do not import fairseq, and its components are registered with fairseq in either import order."""
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_python(code: str, tmp_path: Path, broken_torchaudio: bool) -> subprocess.CompletedProcess:
    path = [str(tmp_path)] if broken_torchaudio else []
    if broken_torchaudio:  # a torchaudio whose binary does not match torch, as with any torch but 2.11
        (tmp_path / "torchaudio").mkdir()
        (tmp_path / "torchaudio" / "__init__.py").write_text(
            "raise OSError('libtorchaudio.so: undefined symbol (built for another torch)')\n"
        )
    prelude = f"import sys; sys.path[:0] = {path!r}\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, cwd=tmp_path)


def test_import_as_package_with_broken_torchaudio(tmp_path):
    result = run_python(
        """
        try:
            import torchaudio
        except OSError as error:
            print("torchaudio does not load:", error)
        else:
            raise SystemExit("the fake torchaudio should not import")
        import ssm_fairseq
        from ssm_fairseq.ssm import KERNELS
        print(sorted(KERNELS))
        """,
        tmp_path,
        broken_torchaudio=True,
    )
    assert result.returncode == 0, result.stderr
    assert "['dss', 'mssm', 's4', 's4d']" in result.stdout


def test_import_through_fairseq_user_dir(tmp_path):
    result = run_python(
        f"""
        from argparse import Namespace
        from fairseq import utils
        utils.import_user_module(Namespace(user_dir={str(REPO / 'ssm_fairseq')!r}))
        import ssm_fairseq
        print(ssm_fairseq.__version__)
        """,
        tmp_path,
        broken_torchaudio=True,
    )
    assert result.returncode == 0, result.stderr
    assert "0.1.0" in result.stdout


def test_the_kernels_need_no_fairseq():
    # sys.modules["fairseq"] = None: `import fairseq` fails and find_spec says it is not there, as if not installed
    result = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys
        sys.modules["fairseq"] = None
        import ssm_fairseq
        from ssm_fairseq.ssm import MSSMKernel
        from ssm_fairseq.layers.encoder_layer import EncoderLayer, LayerConfig
        K, D = MSSMKernel(8, 4, heads=2)(16)
        print(tuple(K.shape), [m for m in sys.modules if m.startswith("fairseq.")])
        """)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(1, 8, 16) []"


def test_user_dir_prints_the_imported_package_directory(tmp_path):
    """``python -m ssm_fairseq.user_dir``: the directory to give ``--user-dir``, that of the package imported."""
    result = subprocess.run([sys.executable, "-m", "ssm_fairseq.user_dir"], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    import ssm_fairseq
    assert result.stdout == f"{Path(ssm_fairseq.__file__).parent}\n"  # the path alone on stdout, for $(...)


def test_console_commands_are_package_functions():
    """Each ``[project.scripts]`` entry of pyproject.toml names a ``main`` inside the package, so an installed
    package runs it without the clone's scripts/."""
    import importlib
    import tomllib
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert sorted(scripts) == ["ssm-average-checkpoints", "ssm-export-onnx", "ssm-lm-distance-ppl", "ssm-mlm-evidence-ppl",
                               "ssm-mlm-reach", "ssm-plot-kernels", "ssm-prepare-librispeech", "ssm-prepare-lm-text",
                               "ssm-seq2seq-attention", "ssm-serve", "ssm-transcribe"]
    for name, target in scripts.items():
        module, function = target.split(":")
        assert module.startswith("ssm_fairseq.") and function == "main", (name, target)
        assert callable(getattr(importlib.import_module(module), function)), (name, target)


def run_in_repo(code: str) -> subprocess.CompletedProcess:
    """``python -c code`` in the repository root (fairseq installed); fails the test unless it exits 0."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


TORCH_ONLY = ("ssm_fairseq.ssm", "ssm_fairseq.layers", "ssm_fairseq.layers.state_space", "ssm_fairseq.layers.attention",
              "ssm_fairseq.asr.encoder", "ssm_fairseq.asr.transducer.predictor", "ssm_fairseq.asr.transducer.joiner",
              "ssm_fairseq.asr.transducer.rnnt_loss", "ssm_fairseq.asr.transducer.pruned_rnnt_loss",
              "ssm_fairseq.asr.preparation", "ssm_fairseq.asr.features.running_cmvn",
              "ssm_fairseq.asr.features.feature_files", "ssm_fairseq.cli.prepare_librispeech")


def test_the_torch_only_subpackages_do_not_import_fairseq():
    """``import ssm_fairseq.ssm`` (and the layers) used to import fairseq, 2 s, through the package's __init__; every
    module of the torch-only packages (the SSM kernels, the layers, the speech encoder, the transducer's parts)
    imports without it, and so does data preparation (``ssm-prepare-librispeech``: 4.6 s of its start-up was fairseq's
    import, for three names and a header reader); ``import ssm_fairseq`` alone imports neither fairseq nor torch."""
    result = run_in_repo(f"""
        import pkgutil, importlib, sys
        import ssm_fairseq
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "fairseq"))[:3])
        for name in {TORCH_ONLY!r}:
            package = importlib.import_module(name)
            for info in pkgutil.walk_packages(getattr(package, "__path__", []), name + "."):
                importlib.import_module(info.name)
        print(sorted(m for m in sys.modules if m == "fairseq" or m.startswith("fairseq.")))
        """)
    assert result.stdout.split("\n")[:2] == ["[]", "[]"]


REGISTERED = """
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.optim.lr_scheduler import LR_SCHEDULER_REGISTRY
    from fairseq.tasks import TASK_REGISTRY
    print("mssm_transducer" in ARCH_MODEL_REGISTRY, "spade_lm" in MODEL_REGISTRY, "speech_transducer" in TASK_REGISTRY,
          "transducer" in CRITERION_REGISTRY, "warmup_hold_exp_decay" in LR_SCHEDULER_REGISTRY)
    """


@pytest.mark.parametrize("first", [
    "import ssm_fairseq; import fairseq.models",  # the import hook registers when fairseq completes
    "import fairseq; import ssm_fairseq",  # registered at once (fairseq-train --user-dir)
    "import ssm_fairseq.integrity.checkpoint_checks",  # one of ours imports fairseq: registered once it is complete
    "from ssm_fairseq.cli.average_checkpoints import main",
])
def test_every_component_is_registered_in_any_import_order(first):
    assert run_in_repo(first + "\n" + textwrap.dedent(REGISTERED)).stdout.split() == ["True"] * 5


def test_commands_print_no_tensorboardx_hint_and_keep_their_logs(tmp_path):
    """fairseq's text_to_speech task logged "Please install tensorboardX" at import, so every command, even
    ``--help``, printed it; the command's own error log still shows."""
    command = [sys.executable, "-m", "ssm_fairseq.cli.average_checkpoints"]
    result = subprocess.run([*command, "--help"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0 and "usage:" in result.stdout
    assert "tensorboardX" not in result.stderr, result.stderr
    result = subprocess.run([*command, "--checkpoint-dir", str(tmp_path), "--output", str(tmp_path / "avg.pt")],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 1 and "tensorboardX" not in result.stderr
    assert f"{tmp_path} has 0 epoch checkpoints (checkpointN.pt); averaging needs 5" in result.stderr


def test_only_the_tensorboardx_hint_is_dropped(caplog):
    import ssm_fairseq  # noqa: F401  (adds the filter)
    fairseq_logger = logging.getLogger("fairseq.tasks.text_to_speech")
    with caplog.at_level(logging.INFO):
        fairseq_logger.info("Please install tensorboardX: pip install tensorboardX")
        fairseq_logger.info("something else")
    assert caplog.messages == ["something else"]
