"""`posenc bench` on the command line: bad input gives one clear line and exit status 2."""

from __future__ import annotations

import pytest

from posenc.cli import main


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["bench", "-s", "rope,nonsense"], "unknown scheme 'nonsense'; valid schemes are"),
        (["bench", "--shape", "1,0"], "seq must be an int >= 1"),
        (["bench", "--shape", "1"], "must be BATCH,SEQ[,PAST][@START]"),
        (["bench", "--backend", "cuda"], "unknown backend(s) ['cuda']"),
        (["bench", "--unit", "layer"], "unknown unit 'layer'"),
        (["bench", "--threads", "0"], "threads must be a positive int"),
        (["bench", "--repeats", "0"], "repeats must be an int >= 1"),
        (["bench", "--suite", "targets", "--unit", "op"], "--suite targets fixes"),
        (["bench", "--suite", "targets", "--num-heads", "4"], "--suite targets fixes"),
        (["bench", "--num-heads", "8", "--num-kv-heads", "3"], "not divisible"),
    ],
)
def test_bad_options_fail_with_a_clear_message(argv, fragment, capsys, tmp_path) -> None:
    assert main([*argv, "-o", str(tmp_path / "out"), "--copy-mib", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posenc bench: error:")
    assert fragment in err
    assert not (tmp_path / "out" / "bench.json").exists()


def test_help_lists_examples(capsys) -> None:
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--suite targets" in out
    assert "posenc bench -s rope" in out


def test_ctrl_c_exits_130_and_keeps_the_results(monkeypatch, tmp_path, capsys) -> None:
    import json

    from posenc.bench import harness

    real = harness.measure_interleaved
    calls = []

    def interrupt_on_second_case(runners, settings):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(runners, settings)

    monkeypatch.setattr(harness, "measure_interleaved", interrupt_on_second_case)
    argv = ["bench", "-s", "alibi", "--unit", "op", "--backend", "torch", "--shape", "1,4", "--shape", "2,4"]
    options = ["--hidden-size", "32", "--num-heads", "4", "--head-dim", "8", "--repeats", "2", "--copy-mib", "1"]
    status = main([*argv, *options, "--quiet", "-o", str(tmp_path)])
    assert status == 130
    assert "interrupted" in capsys.readouterr().err
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["status"] == "interrupted"
    assert [r["shape"]["batch"] for r in saved["results"]] == [1]
