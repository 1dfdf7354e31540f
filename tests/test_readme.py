"""The README's examples run, in order, and each one does what the README says it does.

Every `posenc` command of its shell blocks (and the `python -m posenc...` line that writes the sample checkpoint)
runs in a fresh folder; after each, :data:`OUTCOMES` checks its result: the files it writes, what they say, and
what it prints. `posenc bench` and `posenc demo` have their own tests (tests/bench, tests/test_demo.py) and take
minutes at the README's sizes, so they are only parsed here. Its Python blocks run too.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from posenc.cli import build_parser, main
from posenc.export import load_manifest
from posenc.schemes import scheme_names

README = Path(__file__).resolve().parents[1] / "README.md"
SLOW_COMMANDS = {"bench", "demo"}


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def _lines() -> list[list[str]]:
    """Shell lines that run posenc: ``posenc ...`` and ``python -m posenc...``, comments stripped."""
    lines = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith(("posenc ", "python -m posenc")):
                lines.append(shlex.split(line))
    return lines


def _commands() -> list[list[str]]:
    return [line[1:] for line in _lines() if line[0] == "posenc"]


def _option(argv: list[str], *names: str) -> str | None:
    for name in names:
        if name in argv:
            return argv[argv.index(name) + 1]
    return None


def _exported(argv: list[str], out: str) -> None:
    path = Path(_option(argv, "-o", "--output") or "")
    manifest = load_manifest(path)  # verifies the model's and the weights' sha256
    source = manifest.weights.source
    assert source.kind == ("checkpoint" if "--hf-model" in argv else "random"), source
    assert "weights: " in out


def _validated(argv: list[str], out: str) -> None:
    assert "— PASS" in out
    if "--against-hf" in argv:
        assert "| hf-fp32 |" in out
        assert "| hf-fp64, fp64 angles |" in out
    report = _option(argv, "--report")
    if report:
        assert Path(report).read_text().count("PASS") >= 1


def _optimized(argv: list[str], out: str) -> None:
    path = Path(_option(argv, "-o", "--output") or "")
    manifest = json.loads(path.with_name(path.stem + ".manifest.json").read_text())
    fused = {p["name"]: p["count"] for p in manifest["optimized"]["passes"]}
    assert manifest["optimized"]["target"] == _option(argv, "--target")
    assert any(count > 0 for name, count in fused.items() if name.startswith("fuse_")), fused
    assert manifest["optimized"]["parity"], "the before/after parity check ran"


def _built(argv: list[str], out: str) -> None:
    engine = Path(_option(argv, "-o", "--output") or "")
    assert engine.stat().st_size > 0
    assert engine.with_name(engine.name + ".manifest.json").exists() or any(
        engine.parent.glob("*.engine.manifest.json")
    )


def _inspected(argv: list[str], out: str) -> None:
    assert re.search(r"\d+ nodes", out), out[:300]


def _listed(argv: list[str], out: str) -> None:
    for name in scheme_names():
        assert name in out


def _shown(argv: list[str], out: str) -> None:
    assert "citation:" in out


def _swept(argv: list[str], out: str) -> None:
    prefix = Path(_option(argv, "-o", "--output") or "")
    data = json.loads((prefix / "sweep.json" if prefix.is_dir() else prefix.with_suffix(".json")).read_text())
    assert data["passed"]
    assert data["series"]


def _models(argv: list[str], out: str) -> None:
    from posenc.checkpoints import supported_model_types

    for name in supported_model_types():
        assert name in out
    assert f"{len(supported_model_types())} model types in" in out


OUTCOMES: dict[str, Callable[[list[str], str], None]] = {
    "export": _exported,
    "validate": _validated,
    "optimize": _optimized,
    "build": _built,
    "inspect": _inspected,
    "list": _listed,
    "show": _shown,
    "sweep": _swept,
    "models": _models,
}


def test_readme_names_the_two_commands_and_the_real_model_path_first() -> None:
    text = README.read_text()
    assert "make test" in text
    assert "make demo" in text
    first = _commands()[:2]
    assert first[0][:2] == ["export", "--hf-model"]
    assert first[1][0] == "validate"
    assert "--against-hf" in first[1]


def test_every_readme_command_parses_and_has_an_outcome_check() -> None:
    parser = build_parser()
    for argv in _commands():
        parser.parse_args(argv)  # argparse exits (SystemExit) on an unknown option
        assert argv[0] in OUTCOMES or argv[0] in SLOW_COMMANDS, f"no outcome check for `posenc {argv[0]}`"


def test_readme_commands_run_in_order_and_do_what_they_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    ran = 0
    for line in _lines():
        if line[0] == "python":  # python -m MODULE ARGS
            module = importlib.import_module(line[2])
            assert module.main(line[3:]) == 0, line
            continue
        argv = line[1:]
        if argv[0] in SLOW_COMMANDS:
            continue
        capsys.readouterr()
        assert main(argv) == 0, f"`posenc {' '.join(argv)}` failed"
        OUTCOMES[argv[0]](argv, capsys.readouterr().out)
        ran += 1
    assert ran >= 16


def test_every_python_name_the_readme_gives_exists() -> None:
    """Each dotted name the README's prose gives (`posenc.validate.validate_against_checkpoint(...)`) imports."""
    names = sorted(set(re.findall(r"`(posenc(?:\.\w+)+)", README.read_text())))
    assert "posenc.validate.validate_against_checkpoint" in names
    for name in names:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                value = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for attribute in parts[cut:]:
                assert hasattr(value, attribute), f"the README names {name}, which does not exist"
                value = getattr(value, attribute)
            break


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    from posenc.checkpoints.samples import get_sample

    monkeypatch.chdir(tmp_path)
    get_sample("llama").build(tmp_path / "ckpt")
    namespaces = []
    for code in _blocks("python"):
        namespace: dict[str, object] = {}
        exec(compile(code, str(README), "exec"), namespace)
        namespaces.append(namespace)
    checkpoint, api = namespaces
    out, _, _ = checkpoint["block"](__import__("torch").randn(1, 3, 64))
    reference_out, _, _ = checkpoint["reference"](__import__("torch").randn(1, 3, 64))
    assert out.shape == reference_out.shape == (1, 3, 64)
    assert api["out"].shape == (1, 16, 512)
    assert api["cos"].shape == (1, 131072, 64)
