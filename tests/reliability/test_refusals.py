"""Input errors are refused before any work, with exit status 2 and a message that names the problem and the remedy:
impossible sizes (naming the bytes), parameters outside their domain, and paths that are empty, folders, devices
or FIFOs. Each case below crashed (exit 3), hung, or was accepted before posenc checked it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from posenc.cli import main
from posenc.config import AttentionConfig
from posenc.errors import ConfigError, ModelFileError, PosencError
from posenc.export import export_scheme
from posenc.functional import apply_rope
from posenc.schemes import build_scheme
from posenc.schemes.base import TableMode
from tests.conftest import SMALL


def refused(argv: list[object], capsys: pytest.CaptureFixture[str], *words: str) -> str:
    """Run ``posenc ARGV``; it must exit 2 with one message naming ``words``."""
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    for word in words:
        assert word.lower() in err.lower(), err
    return err


def export_argv(out: Path | str, *extra: object) -> list[object]:
    return ["export", "-s", "rope", "--unit", "op", "--hidden-size", "64", "--num-heads", "4", *extra, "-o", out]


# --- sizes ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [("--max-positions", "100000000000"), ("--hidden-size", "4000000000", "--num-heads", "1")],
    ids=["max-positions", "hidden-size"],
)
def test_sizes_this_machine_cannot_hold_are_refused_naming_the_bytes(tmp_path, capsys, extra) -> None:
    refused(export_argv(tmp_path / "m.onnx", *extra), capsys, "bytes", "memory")
    assert not list(tmp_path.iterdir())


def test_a_call_shape_too_large_is_refused_naming_the_bytes() -> None:
    from posenc.export.feeds import check_call_size
    from posenc.export.shapes import FeedShape

    with pytest.raises(ConfigError, match=r"bytes\) of memory"):
        check_call_size(SMALL, FeedShape(batch=100_000, seq=100_000, past=0))


# --- parameter domains -------------------------------------------------------------------------------------------


def test_rope_yarn_with_theta_one_is_a_config_error_not_zero_division() -> None:
    with pytest.raises(ConfigError, match="rope_theta"):
        build_scheme("rope_yarn", SMALL, {"rope_theta": 1.0}, TableMode.PRECOMPUTED, 64)


def test_configurations_that_overflow_their_dtype_are_refused_at_build_time(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"fp16|float16"):
        export_scheme(
            "rope_longrope",
            tmp_path / "m.onnx",
            params={"attention_factor": 500000.0},
            unit="op",
            config=SMALL,
            dtype="fp16",
            max_positions=64,
        )
    assert not list(tmp_path.iterdir())


def test_apply_rope_with_cos_sin_of_the_wrong_length_is_a_config_error() -> None:
    x = torch.zeros(1, 2, 5, 8)
    cos = sin = torch.zeros(1, 1, 4, 4)  # 4 positions for 5
    with pytest.raises(ConfigError, match="broadcast"):
        apply_rope(x, cos, sin)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["sweep", "--max-position", "-5", "-s", "rope"], ("max_position",)),
        (["sweep", "--dtype", "bf16", "-s", "rope"], ("bf16",)),
    ],
    ids=["sweep-negative-position", "sweep-bf16"],
)
def test_sweep_refuses_bad_values(tmp_path, capsys, argv, words) -> None:
    refused([*argv, "-o", tmp_path / "s"], capsys, *words)


def test_optimize_refuses_a_negative_fold_limit(rope_op16, tmp_path) -> None:
    from posenc.graphs import optimize_file

    model = rope_op16.path
    with pytest.raises(ConfigError, match="fold_limit"):
        optimize_file(model, tmp_path / "o.onnx", "trt", fold_limit=-1)
    assert not (tmp_path / "o.onnx").exists()


def test_build_refuses_a_negative_workspace(rope_op16, tmp_path, capsys) -> None:
    model = rope_op16.path
    refused(["build", model, "--workspace-mib", "-1", "-o", tmp_path / "e.engine"], capsys, "workspace")
    assert not (tmp_path / "e.engine").exists()


# --- paths --------------------------------------------------------------------------------------------------------


def special(folder: Path, kind: str) -> Path:
    path = folder / f"special-{kind}"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    return path


@pytest.mark.parametrize("kind", ["empty", "dir", "fifo"])
@pytest.mark.parametrize("command", ["validate", "inspect", "optimize", "build"])
def test_inputs_that_are_not_regular_non_empty_files_are_refused_without_opening_them(
    tmp_path, capsys, command, kind
) -> None:
    path = special(tmp_path, kind)
    extra = {"optimize": ["--target", "trt", "-o", tmp_path / "o.onnx"], "build": ["-o", tmp_path / "e.engine"]}
    words = {"empty": "empty", "dir": "folder", "fifo": "fifo"}[kind]
    refused([command, path, *extra.get(command, [])], capsys, words)  # a FIFO would block a reader forever
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.parametrize("command", ["export", "build"])
def test_an_empty_output_path_is_refused(tmp_path, capsys, command) -> None:
    model = tmp_path / "m.onnx"
    argv = export_argv("") if command == "export" else ["build", model, "-o", ""]
    refused(argv, capsys, "empty")


@pytest.mark.parametrize("kind", ["dir", "fifo", "device"])
def test_outputs_that_are_folders_fifos_or_devices_are_refused_before_work(tmp_path, capsys, kind) -> None:
    if kind == "device":
        target = Path(os.devnull)  # replaced by a regular file when written as root
        before = os.stat(target)
    else:
        target = special(tmp_path, kind)
    refused(export_argv(target), capsys, {"dir": "folder", "fifo": "fifo", "device": "device"}[kind])
    if kind == "device":
        assert stat.S_ISCHR(os.stat(target).st_mode)
        assert os.stat(target).st_rdev == before.st_rdev
    assert not [p for p in tmp_path.iterdir() if p != target]


def test_an_output_under_a_file_is_refused_before_work(tmp_path, capsys) -> None:
    (tmp_path / "file").write_text("x")
    refused(export_argv(tmp_path / "file" / "m.onnx"), capsys, "not a folder")


def test_a_folder_given_as_the_model_is_named_a_folder(tmp_path) -> None:
    from posenc.export.manifest import load_manifest

    (tmp_path / "m.onnx").mkdir()
    with pytest.raises(ModelFileError, match="is a folder"):
        load_manifest(tmp_path / "m.onnx")


def test_every_refusal_above_is_a_posenc_error() -> None:
    assert issubclass(ConfigError, PosencError)
    assert issubclass(ModelFileError, PosencError)
    with pytest.raises(PosencError):
        AttentionConfig(hidden_size=0, num_heads=1)


def test_sweep_refuses_a_fifo_given_as_its_prefix(tmp_path, capsys) -> None:
    fifo = special(tmp_path, "fifo")
    refused(["sweep", "-s", "rope", "--last-position", "64", "-o", fifo], capsys, "fifo")
    assert sorted(p.name for p in tmp_path.iterdir()) == [fifo.name]


def test_rope_cos_sin_refuses_floating_point_positions() -> None:
    from posenc.functional import rope_cos_sin

    with pytest.raises(ConfigError, match="integer"):
        rope_cos_sin(torch.tensor([0.5]), torch.ones(4))
    cos, _ = rope_cos_sin(torch.tensor([0, 1]), torch.ones(4))
    assert cos.shape == (2, 4)
