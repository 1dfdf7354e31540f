"""The RoPE kernel benchmark: byte counts against notes/performance.md, and a tiny CPU smoke run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from posenc.bench.rope_kernel import (
    DECODE,
    PREFILL,
    SAME_BYTES_COPY,
    KernelCase,
    bytes_moved,
    format_table,
    run_benchmark,
)
from posenc.bench.shapes import Shape
from posenc.config import AttentionConfig
from posenc.records import to_json

ROOT = Path(__file__).resolve().parents[2]


def _triton_missing() -> str | None:
    """Why the kernel cannot run here (triton not importable), or None."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"the RoPE kernel needs triton, which is not importable here ({exc}); pip install triton"
    return None


TRITON_MISSING = _triton_missing()
needs_triton = pytest.mark.skipif(TRITON_MISSING is not None, reason=TRITON_MISSING or "")


def test_bytes_match_the_published_floor() -> None:
    """notes/performance.md §2: 86.0 MB (Llama-3-8B prefill, bf16) and 1.34 MB (decode B=64)."""
    assert bytes_moved(PREFILL) / 1e6 == pytest.approx(86.0, abs=0.05)
    assert bytes_moved(DECODE) / 1e6 == pytest.approx(1.34, abs=0.005)
    fp32 = KernelCase(PREFILL.shape, PREFILL.config, dtype="float32")
    assert bytes_moved(fp32) / 1e6 == pytest.approx(169.9, abs=0.1)


@needs_triton
def test_harness_runs_on_tiny_shapes() -> None:
    tiny = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=32)
    doc = run_benchmark([KernelCase(Shape(1, 4, name="tiny"), tiny)], device="cpu", iters=1, tactics=False)
    contenders = doc.results[0].contenders
    assert [c.name for c in contenders] == [SAME_BYTES_COPY, "posenc kernel (default block)", "torch eager rotate_half"]
    assert all(c.timing is not None and c.timing.runs == 1 and c.us > 0 for c in contenders)
    assert all(
        c.fraction_of_copy_bw == pytest.approx(c.bytes_per_s / doc.copy_bandwidth.bytes_per_s) for c in contenders
    )
    floor, kernel = contenders[0], contenders[1]
    assert doc.targets[0].name == "tiny: ≥ 90% of a copy of the same bytes"
    assert doc.targets[0].measured == pytest.approx(floor.timing.median / kernel.timing.median)
    assert doc.targets[1].name == "tiny: ≥ 90% of copy bandwidth"
    assert "tiny" in format_table(doc)
    assert to_json(doc)["results"][0]["case"]["shape"]["name"] == "tiny"


@needs_triton
def test_script_smoke_writes_json(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_rope_gpu", ROOT / "scripts" / "bench_rope_gpu.py")
    assert spec is not None
    assert spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "bench.json"
    assert script.main(["--smoke", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {r["case"]["shape"]["name"] for r in doc["results"]} == {"smoke-prefill", "smoke-decode"}
