"""``posenc validate`` and ``posenc sweep`` end to end: tables, files and exit statuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc.cli import main
from posenc.export import ExportResult
from tests.conftest import SMALL, private_export
from tests.matrix import MatrixCase, exported


@pytest.fixture
def t5_op(export_cache: Path, tmp_path: Path) -> ExportResult:
    """The T5 op of the parity matrix (the session's shared export); each test gets its own copy (some change or
    truncate it)."""
    return private_export(exported(MatrixCase("t5", "precomputed", "float32", "op"), export_cache, SMALL), tmp_path)


def test_validate_passes_and_writes_reports(t5_op, tmp_path, capsys) -> None:
    report, data, runs = tmp_path / "p.md", tmp_path / "p.json", tmp_path / "p.runs.json"
    argv = ["validate", str(t5_op.path), "--shape", "2,3,1", "--shape", "1,5,7"]
    argv += ["--report", str(report), "--json-out", str(data), "--runs", str(runs)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "| 2, 3, 1 | eager-fp64 | onnxrt-cpu | bias |" in text
    assert "| 1, 5, 7 | eager-fp64 | onnxrt-cpu | bias |" in text
    assert report.read_text() in text
    assert json.loads(data.read_text())["passed"] is True
    assert runs.exists()


def test_validate_exits_1_on_mismatch(t5_op, capsys) -> None:
    data = json.loads(t5_op.manifest_path.read_text())
    data["params"]["max_distance"] = 16  # the graph buckets distances with max_distance 128
    t5_op.manifest_path.write_text(json.dumps(data))
    assert main(["validate", str(t5_op.path), "--shape", "1,20,30"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_validate_exits_2_on_a_truncated_model(t5_op, capsys) -> None:
    t5_op.path.write_bytes(t5_op.path.read_bytes()[:100])
    assert main(["validate", str(t5_op.path)]) == 2
    assert "truncated or corrupt" in capsys.readouterr().err


def test_sweep_command_writes_json_and_markdown(tmp_path, capsys) -> None:
    prefix = tmp_path / "sweep"
    argv = ["sweep", "--scheme", "alibi", "--dtype", "fp32", "--table-mode", "dynamic", "--no-fp16-tables"]
    argv += ["--last-position", "4096", "--per-bucket", "2", "-o", str(prefix)]
    assert main(argv) == 0
    data = json.loads((tmp_path / "sweep.json").read_text())
    assert data["buckets"] == [[0, 1024], [1024, 4097]]
    assert [s["scheme"] for s in data["series"]] == ["alibi"]
    assert "| alibi | float32 | dynamic | float32 |" in (tmp_path / "sweep.md").read_text()
    assert "wrote" in capsys.readouterr().out


def test_validate_with_an_engine_needs_a_gpu_or_says_what_is_missing(t5_op, tmp_path, capsys) -> None:
    """The TrtRunner path: a missing engine file, or no GPU/tensorrt here, is a clear exit-2 error."""
    assert main(["validate", str(t5_op.path), "--engine", str(tmp_path / "absent.engine")]) == 2
    assert "posenc build" in capsys.readouterr().err
    fake = tmp_path / "t5.engine"
    fake.write_bytes(b"not an engine")
    assert main(["validate", str(t5_op.path), "--engine", str(fake)]) == 2
    err = capsys.readouterr().err
    assert "tensorrt" in err.lower() or "gpu" in err.lower()


@pytest.mark.gpu
def test_validate_runs_the_engine_with_trt_runner(t5_op, tmp_path) -> None:
    from posenc.engine import build_engine
    from posenc.engine.targets import current_gpu_target

    if current_gpu_target() is None:
        pytest.skip("needs an NVIDIA GPU with datacenter tensorrt (TrtRunner cannot run engines on a CPU)")
    engine = tmp_path / "t5.engine"
    build_engine(t5_op.path, engine, backend="tensorrt")
    assert main(["validate", str(t5_op.path), "--engine", str(engine), "--shape", "2,5,3"]) == 0


def test_validate_bad_shapes_and_missing_cuda_are_clear_errors(t5_op, capsys) -> None:
    assert main(["validate", str(t5_op.path), "--shape", "1,0"]) == 2
    assert "FeedShape.seq must be an int >= 1, got 0" in capsys.readouterr().err
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert main(["validate", str(t5_op.path), "--provider", "cuda"]) == 2
        assert "has no CUDA provider" in capsys.readouterr().err


def test_sweep_into_a_folder(tmp_path, capsys) -> None:
    folder = tmp_path / "sweeps"
    folder.mkdir()
    argv = ["sweep", "--scheme", "alibi", "--dtype", "fp32", "--table-mode", "dynamic", "--per-bucket", "1"]
    assert main([*argv, "--no-fp16-tables", "--last-position", "4096", "-o", str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["sweep.json", "sweep.md"]


@pytest.fixture
def rope_in_place(rope_inplace96: ExportResult, tmp_path) -> ExportResult:
    """The session's in-place RoPE block (tests/conftest.py); each test gets its own copy (one changes it)."""
    return private_export(rope_inplace96.path, tmp_path)


def test_validate_decode_steps_the_in_place_graph(rope_in_place, tmp_path, capsys) -> None:
    data = tmp_path / "decode.json"
    assert main(["validate", str(rope_in_place.path), "--decode", "--json-out", str(data)]) == 0
    assert "Decode parity (" in capsys.readouterr().out
    report = json.loads(data.read_text())
    steps = len(report["schedule"])
    assert steps == 1 + 64 + 1  # prefill, 64 single tokens, the jump
    assert len(report["rows"]) == steps * 3
    assert all(row["passed"] for row in report["rows"])
    assert report["schedule"][-1]["start"] == rope_in_place.manifest.max_positions - 1


def test_validate_decode_exits_1_when_the_steps_drift(rope_in_place, capsys) -> None:
    data = json.loads(rope_in_place.manifest_path.read_text())
    data["params"]["rope_theta"] = 500.0  # the graph's tables hold theta 10000
    rope_in_place.manifest_path.write_text(json.dumps(data))
    assert main(["validate", str(rope_in_place.path), "--decode", "--shape", "1,4,0", "--shape", "1,1,4"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_validate_decode_refuses_engines_and_random_weights_against_a_checkpoint(rope_in_place, capsys) -> None:
    engine = rope_in_place.path.with_suffix(".engine")
    engine.write_bytes(b"plan")
    assert main(["validate", str(rope_in_place.path), "--decode", "--engine", str(engine)]) == 2
    assert "--engine does not apply to --decode" in capsys.readouterr().err
    assert main(["validate", str(rope_in_place.path), "--decode", "--against-hf", str(rope_in_place.path.parent)]) == 2
    assert "has no config.json" in capsys.readouterr().err
