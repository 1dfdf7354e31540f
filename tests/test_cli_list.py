"""`posenc list` and `posenc show`: every registered scheme, text and JSON, and the errors users see."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posenc import get_spec, scheme_names
from posenc.cli import main

POSENC = Path(sys.executable).parent / "posenc"  # the console script of the environment running the tests


def test_list_shows_every_registered_scheme(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip() and not line.startswith(" ")}
    names = scheme_names()
    assert set(names) <= set(rows), sorted(set(names) - set(rows))
    for name in names:
        spec = get_spec(name)
        assert spec.placement.value in rows[name].split()
        for param in spec.param_names():
            assert param in rows[name]
    assert f"{len(names)} schemes" in out
    assert {"rope_yarn", "rerope", "leaky_rerope", "alibi", "rope_linear_attention", "nope"} <= set(rows)


def test_list_json_parses_and_names_all(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [entry["name"] for entry in data] == scheme_names()
    yarn = next(entry for entry in data if entry["name"] == "rope_yarn")
    assert yarn["placement"] == "qk"
    assert set(yarn["table_modes"]) == {"precomputed", "dynamic"}
    assert {p["name"] for p in yarn["params"]} >= {"factor", "beta_fast", "beta_slow", "mscale", "attention_factor"}


def test_show_rope_yarn_shows_parameters_defaults_and_citation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "rope_yarn"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("rope_yarn: ")
    for text in ("factor (float, default 4.0)", "beta_fast", "truncate (bool, default True)", "citation:", "YaRN",
                 "arXiv:2309.00071", "float32: atol="):  # fmt: skip
        assert text in out, text
    assert main(["show", "alibi", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["name"] == "alibi"
    assert shown["params"][0]["name"] == "symmetric"


def test_show_unknown_scheme_exits_2_with_the_valid_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "bogus"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "unknown scheme 'bogus'; valid schemes are" in captured.err
    for name in scheme_names():
        assert repr(name) in captured.err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "usage: posenc" in capsys.readouterr().out


@pytest.mark.skipif(not POSENC.exists(), reason=f"console script {POSENC} is not installed (pip install -e .)")
def test_console_script_help_and_closed_pipe() -> None:
    result = subprocess.run([str(POSENC), "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "list" in result.stdout
    assert "show" in result.stdout
    assert "usage: posenc" in result.stdout
    # `posenc list | head`: a reader that went away is not an error and prints no traceback.
    process = subprocess.Popen([str(POSENC), "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err.decode()
    assert b"Traceback" not in err, err.decode()


def test_refused_paths_exit_2_and_internal_errors_exit_3(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from posenc import cli

    def refuse(args) -> int:
        raise FileExistsError(17, "File exists", str(tmp_path / "out"))

    def crash(args) -> int:
        raise RuntimeError("a bug")

    for func, status, message in ((refuse, 2, "check the paths you gave"), (crash, 3, "internal error (RuntimeError)")):
        monkeypatch.setattr(cli, "_list", func)  # build_parser wires `list` to it
        assert cli.main(["list"]) == status
        assert message in capsys.readouterr().err
