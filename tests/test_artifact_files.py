"""Atomic writes of artifacts: all or nothing, the main file last, usual permissions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from posenc.artifacts import files
from posenc.artifacts.paths import umask
from posenc.errors import ConfigError, ModelFileError


def _write_all(*targets: Path, fail: bool = False) -> None:
    with files.atomic_outputs(*targets) as temps:
        for temp in temps:
            temp.write_text("new")
        if fail:
            raise RuntimeError("export failed")


def test_a_failing_block_touches_no_target(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_text("old")
    with pytest.raises(RuntimeError, match="export failed"):
        _write_all(tmp_path / "m.onnx", tmp_path / "m.json", fail=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    assert (tmp_path / "m.onnx").read_text() == "old"


def test_the_main_file_lands_last_and_its_side_files_go_if_it_cannot(tmp_path: Path, monkeypatch) -> None:
    order: list[str] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        if not Path(dst).name.startswith("."):  # the journal lands first, hidden
            order.append(Path(dst).name)
        if Path(dst).name == "m.onnx" and failing:
            raise PermissionError("read-only")
        real_replace(src, dst)

    failing = 0
    monkeypatch.setattr(files.os, "replace", replace)
    targets = (tmp_path / "m.onnx", tmp_path / "m.json", tmp_path / "m.pt")
    _write_all(*targets)
    assert order == ["m.pt", "m.json", "m.onnx"]

    order.clear()
    failing = 1
    (tmp_path / "m.json").unlink()
    (tmp_path / "m.pt").unlink()
    (tmp_path / "m.onnx").write_text("old")
    with pytest.raises(ModelFileError, match=r"cannot write .*m\.onnx \(read-only\)"):
        _write_all(*targets)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # no manifest of a model that never landed
    assert (tmp_path / "m.onnx").read_text() == "old"


def test_directories_and_unwritable_places_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "d.onnx").mkdir()
    with pytest.raises(ConfigError, match="is a folder; give a file path inside it"):
        files.write_text_atomic(tmp_path / "d.onnx", "x")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"file is a regular file, not a folder; choose another path"):
        files.write_text_atomic(tmp_path / "file" / "below.json", "x")


def test_files_get_the_usual_permissions(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    try:
        path = files.write_json_atomic(tmp_path / "a.json", {"b": 1, "a": 2})
    finally:
        os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask()
    assert path.read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'


def test_a_new_folder_is_made_and_no_temporary_file_stays(tmp_path: Path) -> None:
    target = files.write_text_atomic(tmp_path / "sub" / "a.txt", "one")
    files.write_text_atomic(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in target.parent.iterdir()] == ["a.txt"]
