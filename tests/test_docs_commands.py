"""Every shell command shown in README.md and docs/*.md names files that exist and flags its program accepts.

The ```bash / ```sh / ```console blocks are parsed (line continuations joined, pipelines, ``&&``, ``;`` and
redirections split, leading ``VAR=value`` assignments dropped), never run. For each simple command:

* every argument that is a path into the repository (``scripts/``, ``recipes/``, ``tests/``, ``ssm_fairseq/``,
  ``docs/``) exists; a program run directly by its path is executable;
* ``python SCRIPT.py`` / ``python -m ssm_fairseq.X``: each ``--flag`` is an option of the argparse parser the
  script builds (captured at its ``parse_args`` call, so nothing after parsing runs);
* a shell script (``recipes/*/run.sh``, ``scripts/*.sh``): each ``--flag`` is one of its ``case`` options, or
  for a recipe, one that recipes/common.sh parses for it;
* ``fairseq-train`` / ``-generate`` / ``-interactive`` / ``-eval-lm`` / ``-validate`` / ``-preprocess``: each
  ``--flag`` is accepted by fairseq's own parser with the plugin's ``--user-dir`` (architecture, task, criterion
  and scheduler options included);
* an installed command of ``pyproject.toml``'s ``[project.scripts]`` (``ssm-transcribe``, ...): each ``--flag`` is
  an option of its module's parser;
* ``make TARGET``: the Makefile has the target.
"""
from __future__ import annotations

import argparse
import os
import re
import runpy
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
REPO_DIRS = ("scripts/", "recipes/", "tests/", "ssm_fairseq/", "docs/")
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|console)[ \t]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
OPERATORS = {"|", "||", "&&", ";", "&"}
REDIRECTS = {">", ">>", "<", "2>", "&>"}
PYTHONS = re.compile(r"^(?:\S*/)?python(?:3(?:\.\d+)?)?$")
# installed command -> the module whose main() it runs
ENTRY_POINTS = {name: target.split(":")[0] for name, target in
                tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"].items()}
FAIRSEQ_PARSERS = {
    "fairseq-train": "get_training_parser",
    "fairseq-generate": "get_generation_parser",
    "fairseq-interactive": "get_interactive_generation_parser",
    "fairseq-eval-lm": "get_eval_lm_parser",
    "fairseq-validate": "get_validation_parser",
    "fairseq-preprocess": "get_preprocessing_parser",
}


@dataclass
class Command:
    """One simple command of a documentation code block."""
    where: str  # FILE:LINE
    words: list[str]


def shell_lines(text: str) -> list[tuple[int, str]]:
    """(line number, logical line) of every shell code block, continuation lines joined, prompts removed."""
    lines = []
    for block in SHELL_BLOCK.finditer(text):
        first = text.count("\n", 0, block.start(1)) + 1
        pending, start = "", None
        for offset, raw in enumerate(block.group(1).split("\n")):
            line = raw[2:] if raw.startswith("$ ") else raw
            if start is None:
                start = first + offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            pending += line
            if pending.strip():
                lines.append((start, pending))
            pending, start = "", None
    return lines


def simple_commands(line: str) -> list[list[str]]:
    """The words of each simple command of one shell line (comments, redirections and assignments dropped)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
    lexer.whitespace_split = True
    commands, words, skip_next = [], [], False
    for token in lexer:
        if skip_next:
            skip_next = False
        elif token in OPERATORS:
            commands.append(words)
            words = []
        elif token in REDIRECTS or token.endswith(">") and token[:-1].isdigit():
            skip_next = True
        elif not words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", token):
            continue  # VAR=value before the program
        else:
            words.append(token)
    commands.append(words)
    return [c for c in commands if c]


def doc_commands(path: Path) -> list[Command]:
    """Every simple command in the shell code blocks of one markdown file."""
    text = path.read_text(encoding="utf-8")
    return [Command(f"{path.relative_to(REPO)}:{number}", words)
            for number, line in shell_lines(text) for words in simple_commands(line)]


def flags(words: list[str]) -> list[str]:
    """The options a command line gives (``--name`` and ``-x``; ``--name=value`` as ``--name``)."""
    found = []
    for word in words:
        if word == "--":
            break
        word = word.strip("[]")  # a usage synopsis: run.sh [--stage N]
        if re.match(r"^--[A-Za-z][\w-]*(=.*)?$", word) or re.match(r"^-[A-Za-z]$", word):
            found.append(word.split("=", 1)[0])
    return found


class _Parsed(Exception):
    """Raised in place of ``parse_args`` to hand the script's parser back without running the script."""

    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__()
        self.parser = parser


def captured_parser(script: Path | None = None, module: str | None = None) -> argparse.ArgumentParser:
    """The argparse parser a script or module builds in ``__main__``, captured at its first parse call."""
    def capture(self, *args, **kwargs):
        raise _Parsed(self)

    def refuse_exec(*args, **kwargs):  # a script that replaced itself here would end the whole test session, exit 0
        raise AssertionError(f"{script or module} replaces its process (os.exec*) before parsing its arguments")

    saved = (argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args, list(sys.argv),
             list(sys.path), os.execv, os.execve)
    argparse.ArgumentParser.parse_args = capture
    argparse.ArgumentParser.parse_known_args = capture
    os.execv = os.execve = refuse_exec
    try:
        if script is not None:
            sys.argv = [str(script)]
            sys.path.insert(0, str(script.parent))  # as `python SCRIPT` does (benchmarks import measurement.py)
            runpy.run_path(str(script), run_name="__main__")
        else:
            sys.argv = [module]
            runpy.run_module(module, run_name="__main__", alter_sys=False)
    except _Parsed as parsed:
        return parsed.parser
    finally:
        (argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args, sys.argv,
         sys.path, os.execv, os.execve) = saved
    raise AssertionError(f"{script or module} did not parse arguments with argparse in __main__")


def case_options(script: Path) -> set[str]:
    """The ``--options`` a shell script accepts: those of its ``case "$1" in`` argument loop, and for a recipe that
    hands its arguments to recipes/common.sh, the ones parsed there: --stage, --stop-stage, --conf where the recipe
    sets a default conf, and the options the recipe lists in recipe_options."""
    text = script.read_text(encoding="utf-8")
    options = set()
    for match in re.finditer(r"^\s*((?:--[\w-]+\|?)+)\)", text, re.MULTILINE):
        options.update(match.group(1).split("|"))
    if re.search(r'^source "\$repo/recipes/common\.sh" "\$@"', text, re.MULTILINE):
        options |= case_options(REPO / "recipes/common.sh")
        if not re.search(r"^conf=", text, re.MULTILINE):
            options.discard("--conf")
        listed = re.search(r'^recipe_options="([^"]*)"', text, re.MULTILINE)
        options.update(listed.group(1).replace(",", " ").split() if listed else [])
    return options


def make_targets() -> set[str]:
    """The Makefile's targets."""
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(encoding="utf-8"), re.MULTILINE))


def fairseq_unknown_flags(tool: str, args: list[str]) -> list[str]:
    """The ``--flags`` of ``args`` that fairseq's parser for ``tool`` does not accept (plugin loaded)."""
    from fairseq import options

    args = [a for a in args if a != "..."]
    if "--user-dir" in args:
        args[args.index("--user-dir") + 1] = str(REPO / "ssm_fairseq")
    parser = getattr(options, FAIRSEQ_PARSERS[tool])()
    try:
        if tool == "fairseq-preprocess" or (tool == "fairseq-train" and "--arch" not in args):
            _, extra = parser.parse_known_args(args)  # (a command elided with '...' names no --arch)
        else:
            _, extra = options.parse_args_and_arch(parser, input_args=args, parse_known=True)
    except SystemExit as exit_:
        return [f"fairseq's parser exited ({exit_.code}) on {' '.join(args)}"]
    return [e for e in extra if e.startswith("-")]


def program(words: list[str]) -> tuple[str, str | None, list[str], bool]:
    """(kind, target, arguments, run directly by its path) of a command; kind '' for programs not checked."""
    first, rest = words[0], words[1:]
    if first == "torchrun":
        if "--no-python" not in rest:
            return "", None, [], False
        rest = rest[rest.index("--no-python") + 1:]
        return program(rest) if rest else ("", None, [], False)
    if PYTHONS.match(first):
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            rest = rest[1:]  # interpreter options (-u, -X ...)
        if len(rest) >= 2 and rest[0] == "-m":
            return "module", rest[1], rest[2:], False
        return ("python", rest[0], rest[1:], False) if rest else ("", None, [], False)
    if first in ("bash", "sh"):
        return ("shell", rest[0], rest[1:], False) if rest else ("", None, [], False)
    if first == "make":
        return "make", None, rest, False
    name = first.rsplit("/", 1)[-1]
    if name in ENTRY_POINTS:
        return "module", ENTRY_POINTS[name], rest, False
    if name in FAIRSEQ_PARSERS:
        return "fairseq", name, rest, False
    if first.startswith(REPO_DIRS):
        return ("python" if first.endswith(".py") else "shell"), first, rest, True
    return "", None, [], False


def problems(command: Command) -> list[str]:
    """What is wrong with one documented command (empty when nothing)."""
    found = []
    for word in command.words:
        if word.startswith(REPO_DIRS) and not (REPO / word).exists():
            found.append(f"{word} does not exist")
    kind, target, args, direct = program(command.words)
    if kind in ("python", "shell"):
        path = REPO / target
        if not path.is_file():
            return list(dict.fromkeys(found + [f"{target} does not exist"]))
        if direct and not os.access(path, os.X_OK):
            found.append(f"{target} is run directly but is not executable")
        if kind == "python":
            accepted = set(captured_parser(script=path)._option_string_actions)
        else:
            accepted = case_options(path)
        found += [f"{target} does not accept {flag}" for flag in flags(args) if flag not in accepted]
    elif kind == "module" and target.split(".")[0] == "ssm_fairseq":
        accepted = set(captured_parser(module=target)._option_string_actions)
        found += [f"python -m {target} does not accept {flag}" for flag in flags(args) if flag not in accepted]
    elif kind == "fairseq":
        found += [f"{target}: {message}" for message in fairseq_unknown_flags(target, args)]
    elif kind == "make":
        targets = make_targets()
        found += [f"the Makefile has no target {word}" for word in args
                  if "=" not in word and not word.startswith("-") and word not in targets]
    return found


ALL_COMMANDS = [command for path in DOC_FILES for command in doc_commands(path)]


def test_the_docs_show_commands():
    assert len(DOC_FILES) > 5 and len(ALL_COMMANDS) > 30


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=[c.where for c in ALL_COMMANDS])
def test_documented_command(command: Command):
    assert not problems(command), f"{command.where}: {' '.join(command.words)}: {problems(command)}"


def test_the_checker_finds_wrong_commands(tmp_path):
    """Missing files, unknown flags and non-executable scripts are reported; continuations are joined."""
    doc = tmp_path / "doc.md"
    doc.write_text("```bash\n"
                   "NPROC=2 recipes/librispeech/run.sh --stage 2 \\\n  --no-such-stage 3   # comment\n"
                   "python scripts/prepare_librispeech.py --out x --no-such-flag | tee log > out.txt\n"
                   "python -m ssm_fairseq.transcribe --checkpoint c.pt --beem 4 a.flac\n"
                   "scripts/plot_kernels.py CKPT -o k.png\n"
                   "bash scripts/no_such_script.sh --x\n"
                   "fairseq-generate DATA --user-dir ssm_fairseq --task speech_transducer --beam 4 --no-such\n"
                   "make demo no-such-target\n"
                   "ssm-average-checkpoints --checkpoint-dir d --lats 3 --output o.pt\n"
                   "```\n```python\nnot --a command\n```\n", encoding="utf-8")
    commands = [Command(f"doc.md:{number}", words)
                for number, line in shell_lines(doc.read_text()) for words in simple_commands(line)]
    assert [c.words[0] for c in commands] == ["recipes/librispeech/run.sh", "python", "tee", "python",
                                              "scripts/plot_kernels.py", "bash", "fairseq-generate", "make",
                                              "ssm-average-checkpoints"]
    reports = [problems(c) for c in commands]
    assert reports[0] == ["recipes/librispeech/run.sh does not accept --no-such-stage"]
    assert reports[1] == ["scripts/prepare_librispeech.py does not accept --no-such-flag"]
    assert reports[2] == []  # tee; out.txt is a redirection target, not an argument
    assert reports[3] == ["python -m ssm_fairseq.transcribe does not accept --beem"]
    assert reports[4] == ["scripts/plot_kernels.py is run directly but is not executable"] or \
        os.access(REPO / "scripts/plot_kernels.py", os.X_OK)
    assert "scripts/no_such_script.sh does not exist" in reports[5]
    assert reports[6] == ["fairseq-generate: --no-such"]
    assert reports[7] == ["the Makefile has no target no-such-target"]
    assert reports[8] == ["python -m ssm_fairseq.cli.average_checkpoints does not accept --lats"]


@pytest.mark.parametrize("recipe", sorted(p.relative_to(REPO).as_posix() for p in REPO.glob("recipes/*/run.sh")))
def test_recipe_options_are_those_its_usage_error_lists(recipe):
    """case_options reads what a recipe accepts: the options its unknown-argument error names (exit 2, at parsing;
    with no python to find, a recipe that parsed on would stop at recipes/common.sh's ssm_fairseq lookup)."""
    result = subprocess.run(["bash", recipe, "--no-such-option"], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "PYTHON_BIN": "/nonexistent", "USER_DIR": ""}, timeout=60)
    listed = re.search(r"^unknown argument: --no-such-option \(expected (.*)\)$", result.stderr, re.MULTILINE)
    assert result.returncode == 2 and listed, result.stderr
    assert set(listed.group(1).split(", ")) == case_options(REPO / recipe)
