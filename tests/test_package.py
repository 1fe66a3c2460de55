"""The plugin imports as a package and through fairseq's --user-dir, also when torchaudio cannot load."""
import subprocess
import sys
import textwrap
from pathlib import Path

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
        from ssm_fairseq.modules.encoder_layer import EncoderLayer, LayerConfig
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
    assert sorted(scripts) == ["ssm-average-checkpoints", "ssm-lm-distance-ppl", "ssm-mlm-evidence-ppl",
                               "ssm-mlm-reach", "ssm-plot-kernels", "ssm-prepare-librispeech", "ssm-prepare-lm-text",
                               "ssm-seq2seq-attention", "ssm-transcribe"]
    for name, target in scripts.items():
        module, function = target.split(":")
        assert module.startswith("ssm_fairseq.") and function == "main", (name, target)
        assert callable(getattr(importlib.import_module(module), function)), (name, target)
