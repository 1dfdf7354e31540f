"""`posenc --help` starts without the heavy libraries: a subcommand's module is imported only when it is chosen.

Each check runs the command line in a fresh interpreter, as the console script does, under ``python -X importtime``
(every module the interpreter imports, one line each on stderr) and looks for the heavy ones by name. No timing is
asserted here; the figures are in docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

import posenc
from posenc.cli import COMMANDS, build_parser

HEAVY = ("torch", "numpy", "onnx", "onnxruntime", "onnxscript", "onnx_ir", "polygraphy", "transformers", "matplotlib")
ONNX_STACK = tuple(name for name in HEAVY if name not in ("torch", "numpy"))
# The console script's body (`posenc = "posenc.cli:main"`), with this test run's posenc first on the path.
SCRIPT = "import sys; from posenc.cli import main; sys.exit(main())"
SOURCE = str(Path(posenc.__file__).resolve().parents[1])


def imported_modules(*argv: str) -> tuple[set[str], str]:
    """The top-level packages a fresh ``posenc ARGV`` imports, and its stdout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SOURCE, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", SCRIPT, *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    names = {
        line.rpartition("|")[2].strip().split(".")[0]
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "posenc" in names, "python -X importtime printed no imports: the check would prove nothing"
    return names, result.stdout


@pytest.mark.parametrize("argv", [["--help"], [], ["--version"]], ids=["help", "no-arguments", "version"])
def test_help_imports_no_heavy_library(argv: list[str]) -> None:
    names, out = imported_modules(*argv)
    assert not names & set(HEAVY), sorted(names & set(HEAVY))
    if argv != ["--version"]:
        for command in ("list", "show", *COMMANDS):
            assert f"\n    {command} " in out, command


def test_list_imports_torch_but_no_onnx_stack() -> None:
    names, out = imported_modules("list")
    assert "rope_yarn" in out
    assert "torch" in names  # the schemes are torch modules; the check below would pass vacuously without them
    assert not names & set(ONNX_STACK), sorted(names & set(ONNX_STACK))


def test_stub_help_lines_match_each_subcommand_module() -> None:
    """`posenc --help` lists each subcommand from COMMANDS without importing it: the line its module gives."""

    def help_lines(parser: argparse.ArgumentParser) -> dict[str, str | None]:
        action = next(a for a in parser._actions if a.dest == "command")
        return {choice.dest: choice.help for choice in action._choices_actions}

    full, lazy = help_lines(build_parser()), help_lines(build_parser(load=()))
    assert list(full) == list(lazy) == ["list", "show", *COMMANDS]
    assert full == lazy
