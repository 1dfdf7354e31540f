"""The TensorRT plugin on a GPU: engine from the ONNX plugin graph vs float64, and a Python-free run.

Everything runs in a fresh process (gpu_worker.py): this process imported triton with its interpreter on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TOLERANCE = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}


def _skip_reason() -> str | None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        return "needs torch"
    if not torch.cuda.is_available():
        return "needs an NVIDIA GPU (torch.cuda.is_available() is False)"
    try:
        import tensorrt
        import tensorrt.plugin
    except ImportError as exc:
        return f"needs datacenter TensorRT >= 10.9 with tensorrt.plugin ({exc}); pip install 'posenc[trt]'"
    if not hasattr(tensorrt, "QuickPluginCreationRequest"):
        return "needs TensorRT >= 10.9 (ahead-of-time Python plugins)"
    return None


REASON = _skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.trt, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def _worker(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("gpu_worker.py")), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_kernel_on_gpu_matches_float64() -> None:
    result = _worker("kernel")
    for name, error in result["errors"].items():
        dtype = "float16" if "float16" in name else "bfloat16" if "bfloat16" in name else "float32"
        assert error < TOLERANCE[dtype] * 2, (name, error)


@pytest.mark.parametrize(
    ("source", "dtype", "functions"),
    [
        ("table", "float16", "0"),
        ("table", "bfloat16", "1"),
        ("freq", "float32", "0"),
        ("ntk", "bfloat16", "1"),
    ],
)
def test_engine_from_onnx_plugin_graph(source: str, dtype: str, functions: str, tmp_path: Path) -> None:
    result = _worker(f"engine:{source}:{dtype}:{functions}", str(tmp_path))
    assert "error" not in result, result
    assert any("PLUGIN" in t for t in result["layers"]), result["layers"]  # the plugin, not the inlined twin
    assert max(result["errors"]) < TOLERANCE[dtype] * 2, result["errors"]


def test_engine_runs_without_python_plugin_code(tmp_path: Path) -> None:
    _worker("engine:freq:float32:0", str(tmp_path))
    result = _worker("python_free", str(tmp_path))
    assert result["posenc_modules"] == []
    assert max(result["diffs"]) == 0.0
