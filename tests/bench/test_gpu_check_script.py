"""scripts/gpu_check.py, the one GPU call of a session, smoke-tested here on the CPU (Triton's interpreter): its
kernel rows hold the Triton RoPE kernel to the float64 scheme rotation, its eager rows hold the fp16/bf16 block to
the float64 block, and a section that crashes becomes an error row instead of ending the run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("triton", reason="the RoPE kernel needs triton")


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_smoke_run_holds_kernel_and_half_block_to_float64(tmp_path: Path) -> None:
    script = _script()
    code = script.main(["--device", "cpu", "--quick", "--schemes", "rope", "alibi", "-o", str(tmp_path)])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    kernel = report["kernel-parity"]["rows"]
    assert len(kernel) == 3 * 2  # three angle sources, fp32 and bf16
    assert all(r["status"] == "pass" and r["worst_fraction_of_tolerance"] < 1 for r in kernel)
    assert {r["positions"] for r in kernel} >= {"131035..131039"}  # in-kernel angles near the 2^17 context
    eager = report["eager-half"]["rows"]
    assert {(r["scheme"], r["dtype"]) for r in eager} == {
        (s, d) for s in ("rope", "alibi") for d in ("float16", "bfloat16")
    }
    assert all(r["status"] == "pass" for r in eager)
    assert report["tensorrt"]["status"] == "skipped"
    assert "not importable" in report["tensorrt"]["reason"]
    assert code == 0
    assert "kernel-parity" in (tmp_path / "gpu_check.md").read_text()


def test_a_wrong_kernel_fails_its_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel rows can fail: a kernel that returns q and k unrotated is caught."""
    import posenc.plugins.rope as rope

    monkeypatch.setattr(rope, "rope_qk", lambda q, k, spec, **_: (q.clone(), k.clone()))
    script = _script()
    code = script.main(["--device", "cpu", "--quick", "--schemes", "rope", "-o", str(tmp_path)])
    kernel = json.loads((tmp_path / "gpu_check.json").read_text())["kernel-parity"]["rows"]
    assert all(r["status"] == "FAIL" for r in kernel)
    assert code == 1
