"""Never overwrite an input or another artifact's companion, and never replay a journal posenc did not write."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from posenc import AttentionConfig
from posenc.artifacts import files
from posenc.cli import main
from posenc.export import export_scheme

CONFIG = AttentionConfig(hidden_size=32, num_heads=2, num_kv_heads=1, max_position_embeddings=64)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_scheme("rope", tmp_path_factory.mktemp("apart") / "m.onnx", config=CONFIG).path


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize(
    ("argv", "clash"),
    [
        (["build", "{m}", "-o", "{m}"], "m.onnx"),
        (["build", "{m}", "-o", "{d}/m.manifest.json"], "m.manifest.json"),
        (["optimize", "{m}", "--target", "ort-cpu", "-o", "{d}/m.manifest.json"], "m.manifest.json"),
        (["validate", "{m}", "--report", "{m}"], "m.onnx"),
        (["validate", "{m}", "--json-out", "{d}/m.manifest.json"], "m.manifest.json"),
        (["validate", "{m}", "--runs", "{d}/m.weights.safetensors"], "m.weights.safetensors"),
        (["export", "-s", "rope", "-o", "{d}/m"], "m.onnx beside it"),
    ],
)
def test_an_output_that_would_overwrite_an_input_is_refused_before_any_work(
    model: Path, argv: list[str], clash: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _snapshot(model.parent)
    assert main([a.format(m=model, d=model.parent) for a in argv]) == 2
    assert clash in capsys.readouterr().err
    assert _snapshot(model.parent) == before  # nothing written, nothing lost


def test_two_outputs_that_are_one_file_are_refused(model: Path, tmp_path: Path) -> None:
    report = tmp_path / "r.md"
    assert main(["validate", str(model), "--report", str(report), "--json-out", str(report)]) == 2
    assert not report.exists()


def _plant(folder: Path, staged_content: bytes, mac: str = "0" * 64) -> Path:
    """What an attacker who can write into ``folder`` leaves: a staged file and a journal moving it onto notes.txt."""
    staged = folder / f".notes.txt{files.STAGING_MARK}1-evil.tmp"
    staged.write_bytes(staged_content)
    stat = staged.stat()
    moves = [[staged.name, "notes.txt", stat.st_ino, stat.st_size, stat.st_ctime_ns]]
    (folder / f"{files.STAGING_MARK}commit-1-evil.json").write_text(json.dumps({"moves": moves, "mac": mac}))
    return staged


def test_a_planted_journal_is_never_replayed(model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    for name, data in _snapshot(model.parent).items():
        (folder / name).write_bytes(data)
    (folder / "notes.txt").write_text("the user's notes")
    _plant(folder, b"the attacker's content")
    assert main(["validate", str(folder / "m.onnx"), "--shape", "1,2"]) == 0  # a reader settles the folder first
    assert (folder / "notes.txt").read_text() == "the user's notes"
    assert not [n for n in os.listdir(folder) if files.STAGING_MARK in n]  # the planted files are cleared


def test_a_journal_signed_for_other_staged_files_moves_nothing(tmp_path: Path) -> None:
    """A genuine signature on a journal whose staged file was swapped for another of the same size (the inode may
    be reused) moves nothing: the swapped file's change time differs."""
    (tmp_path / "notes.txt").write_text("mine")
    staged = tmp_path / f".notes.txt{files.STAGING_MARK}1-evil.tmp"
    staged.write_bytes(b"genuine")
    moves = [[staged.name, "notes.txt", *files._staged_identity(staged)]]
    signature = files._signature(tmp_path, moves)
    staged.unlink()
    time.sleep(0.01)
    _plant(tmp_path, b"swapped", mac=signature)  # same name and size
    files.settle(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_sigterm_is_handled_like_ctrl_c(tmp_path: Path) -> None:
    """`timeout` and job schedulers send SIGTERM: the command ends with 143, its scratch folder removed."""
    import signal
    import subprocess
    import sys

    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch_root)}
    argv = [sys.executable, "-m", "posenc.cli", "sweep", "-s", "rope", "--per-bucket", "2", "-o", str(tmp_path / "s")]
    process = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(scratch_root.iterdir()) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, process.stderr.read() if process.stderr else ""
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err
    assert "terminated" in err
    assert list(scratch_root.iterdir()) == []  # the sweep's scratch folder went with it
    assert not (tmp_path / "s.json").exists()


def test_a_long_output_name_that_fits_is_written(tmp_path: Path) -> None:
    """A 225-character name fits (255 bytes); its staging name, longer, must not make the write fail."""
    name = "m" * 220 + ".onnx"
    result = export_scheme("rope", tmp_path / name, config=CONFIG)
    assert result.path.name == name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [name, "m" * 220 + ".manifest.json", "m" * 220 + ".weights.safetensors"]
    )


def test_demo_never_deletes_files_it_did_not_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from posenc.demo.landing import WRITTEN_NAME, clear_previous_results, record_results

    (tmp_path / "parity").mkdir()
    (tmp_path / "parity" / "rope.md").write_text("a previous run's table")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bench.json").write_text("{}")
    record_results(tmp_path)  # as a run does at its end
    assert json.loads((tmp_path / WRITTEN_NAME).read_text())["files"] == ["bench/bench.json", "parity/rope.md"]
    (tmp_path / "parity" / "my-notes.md").write_text("the user's own file")
    assert main(["demo", "--quick", "-o", str(tmp_path)]) == 2  # refused before any work
    assert "parity/my-notes.md" in capsys.readouterr().err
    assert (tmp_path / "parity" / "my-notes.md").read_text() == "the user's own file"
    assert (tmp_path / "parity" / "rope.md").exists()
    (tmp_path / "parity" / "my-notes.md").unlink()
    clear_previous_results(tmp_path)  # only what a run recorded: removed, with the emptied folders
    assert not (tmp_path / "parity").exists()
    assert not (tmp_path / "bench").exists()


def test_a_demo_report_that_cannot_be_written_leaves_the_previous_one_whole(tmp_path: Path, monkeypatch) -> None:
    """A full disk while the report is written: the previous report stays as it was, nothing of the new one lands,
    and the staging folder is gone; a report that can be written lands whole."""
    import errno
    import types

    import posenc.demo.report as report_module
    from posenc.demo.landing import REPORT_STAGING, RESULT_NAME, land_report

    (tmp_path / "report.md").write_text("previous report\n")

    def full_disk(result, bench_doc, folder) -> None:
        (Path(folder) / "report.md").write_text("half of a new rep")
        raise OSError(errno.ENOSPC, "No space left on device")

    result = types.SimpleNamespace(to_dict=lambda: {"status": "complete"})
    monkeypatch.setattr(report_module, "write_demo_report", full_disk)
    with pytest.raises(OSError, match="No space"):
        land_report(result, None, tmp_path)
    assert (tmp_path / "report.md").read_text() == "previous report\n"
    assert not (tmp_path / RESULT_NAME).exists()
    assert not (tmp_path / REPORT_STAGING).exists()

    def whole(result, bench_doc, folder) -> None:
        (Path(folder) / "report.md").write_text("new report\n")
        (Path(folder) / "report.html").write_text("<p>new report</p>\n")

    monkeypatch.setattr(report_module, "write_demo_report", whole)
    land_report(result, None, tmp_path)
    assert (tmp_path / "report.md").read_text() == "new report\n"
    assert json.loads((tmp_path / RESULT_NAME).read_text()) == {"status": "complete"}
    assert not (tmp_path / REPORT_STAGING).exists()
