"""The README's examples run: every `posenc` command of its shell blocks, in order, and its Python block.

`posenc bench` and `posenc demo` have their own tests (tests/bench, tests/test_demo.py) and take minutes at
the README's sizes, so they are only parsed here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from posenc.cli import build_parser, main

README = Path(__file__).resolve().parents[1] / "README.md"
SLOW_COMMANDS = {"bench", "demo"}


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def _commands() -> list[list[str]]:
    commands = []
    for block in _blocks("bash"):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("posenc "):
                commands.append(shlex.split(line)[1:])
    return commands


def test_readme_names_the_two_commands_and_posenc_list() -> None:
    text = README.read_text()
    assert "make test" in text
    assert "make demo" in text
    assert ["list"] in _commands()


def test_every_readme_command_parses() -> None:
    parser = build_parser()
    for argv in _commands():
        parser.parse_args(argv)  # argparse exits (SystemExit) on an unknown option


def test_readme_commands_run_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    ran = 0
    for argv in _commands():
        if argv[0] in SLOW_COMMANDS:
            continue
        assert main(argv) == 0, f"`posenc {' '.join(argv)}` failed"
        ran += 1
    assert ran >= 12
    assert (tmp_path / "out" / "yarn.engine").stat().st_size > 0
    assert (tmp_path / "out" / "yarn.parity.md").read_text().count("PASS") >= 1


def test_readme_python_block_runs() -> None:
    (code,) = _blocks("python")
    namespace: dict[str, object] = {}
    exec(compile(code, str(README), "exec"), namespace)
    assert namespace["out"].shape == (1, 16, 512)  # type: ignore[attr-defined]
    assert namespace["cos"].shape == (1, 131072, 64)  # type: ignore[attr-defined]
