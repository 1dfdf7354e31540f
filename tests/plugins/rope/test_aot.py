"""Ahead-of-time PTX for the TensorRT plugin: every kernel variant for sm_80, sm_89 and sm_90 (compile only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posenc.errors import BuildError
from posenc.plugins.rope import RopeKernelSpec
from posenc.plugins.rope.aot import (
    NUM_SCALAR_ARGS,
    compile_rope_ptx,
    contiguous_scalar_args,
    launch_grid,
    spec_for_build,
)

pytest.importorskip("triton", reason="PTX compilation needs triton")

ROOT = Path(__file__).resolve().parents[3]
ARCHS = (80, 89, 90)
# (angle source, layout, rotary_dim, head_dim, q/k dtype, table dtype, positions, longrope_original)
VARIANTS = [
    ("table", "half", 128, 128, "bfloat16", "float32", "ids", 0),
    ("table", "interleaved", 64, 128, "float16", "float16", "offset", 0),
    ("cache", "half", 64, 80, "float32", "bfloat16", "ids", 0),
    ("cache", "interleaved", 128, 128, "bfloat16", "float32", "ids", 0),
    ("freq", "half", 128, 128, "float16", None, "ids", 0),
    ("freq", "interleaved", 96, 128, "bfloat16", None, "offset", 4096),
    ("ntk", "half", 128, 128, "float32", None, "offset", 0),
    ("ntk", "interleaved", 64, 64, "bfloat16", None, "ids", 0),
]


def _spec(source: str, layout: str, rotary_dim: int, head_dim: int, positions: str, longrope: int) -> dict:
    spec = {"angles": source, "rotary_dim": rotary_dim, "head_dim": head_dim, "layout": layout, "positions": positions}
    if source == "ntk":
        spec.update(max_position_embeddings=8192, factor=4.0)
    if source == "freq":
        spec.update(attention_factor=1.2, longrope_original=longrope)
    return spec


def _compile_in_subprocess(arch: int, variants: list[dict]) -> list[dict]:
    """Triton cannot compile in a process that imported it with TRITON_INTERPRET=1 (set for the kernel tests)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("compile_worker.py"))],
        input=json.dumps({"arch": arch, "variants": variants}),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_for_every_variant(arch: int) -> None:
    """Every variant compiles; the entry takes exactly inputs + int32 scalars + outputs; the PTX assembles."""
    requests = [
        {"spec": _spec(v[0], v[1], v[2], v[3], v[6], v[7]), "qk_dtype": v[4], "table_dtype": v[5], "assemble": i == 0}
        for i, v in enumerate(VARIANTS)
    ]
    requests.append({**requests[0], "block_h": 16, "num_warps": 4, "assemble": True})  # Llama-like tactic
    results = _compile_in_subprocess(arch, requests)
    for variant, result in zip([*VARIANTS, VARIANTS[0]], results, strict=True):
        assert "error" not in result, (variant, result.get("error"))
        n_inputs = {"table": 5, "cache": 4, "freq": 4, "ntk": 3}[variant[0]]
        assert result["target"].startswith(f"sm_{arch}"), result["target"]
        assert result["version"] == "8.0"  # loadable by CUDA 12.0+ drivers
        assert result["name"] == result["kernel_name"]
        # TensorRT passes inputs, int32 scalars, outputs: exactly what the entry now declares
        assert len(result["params"]) == result["expected_params"] == n_inputs + NUM_SCALAR_ARGS + 2, variant
        assert sum(".u32" in p for p in result["params"]) == NUM_SCALAR_ARGS
        assert result["removed_scratch_params"] == 2  # Triton 3.9 appends global/profile scratch pointers
    assert results[0]["cubin_bytes"] > 0
    assert results[-1]["cubin_bytes"] > 0
    assert results[-1]["vector_loads"] > 0  # 16-byte loads of q/k rows


def test_compiling_under_the_interpreter_is_refused() -> None:
    spec = RopeKernelSpec("table", 64, 64)
    with pytest.raises(BuildError, match="TRITON_INTERPRET"):
        compile_rope_ptx(spec, arch=90, qk_dtype="float16", table_dtype="float32")


def test_scratch_param_in_use_is_refused() -> None:
    from posenc.plugins.rope.aot import _strip_unused_trailing_params

    ptx = ".entry k(\n\t.param .u64 k_param_0,\n\t.param .u64 k_param_1\n)\n{\n\tld.param.u64 %rd1, [k_param_1];\n}"
    with pytest.raises(BuildError, match="scratch"):
        _strip_unused_trailing_params(ptx, 1)
    with pytest.raises(BuildError, match="expected 5"):
        _strip_unused_trailing_params(ptx, 5)


@pytest.mark.parametrize("fmt", ["bhsd", "bshd"])
@pytest.mark.parametrize("source", ["table", "cache", "freq", "ntk"])
def test_symbolic_launch_args_match_torch_strides(source: str, fmt: str) -> None:
    """The plugin computes its scalars from shapes; they must equal the strides of contiguous tensors."""
    B, Hq, Hkv, S, D, r = 3, 8, 2, 5, 64, 32
    spec = RopeKernelSpec(source, r, D, positions="ids", max_position_embeddings=4)
    q = torch.empty(B, Hq, S, D) if fmt == "bhsd" else torch.empty(B, S, Hq, D)
    k = torch.empty(B, Hkv, S, D) if fmt == "bhsd" else torch.empty(B, S, Hkv, D)
    angle = {"table": torch.empty(100, r // 2), "cache": torch.empty(B, S, r // 2)}.get(source)
    positions = torch.empty(1, S, dtype=torch.int64)
    got = contiguous_scalar_args(spec, fmt, q.shape, k.shape, None if angle is None else angle.shape, positions.shape)

    def bhs(t: torch.Tensor) -> list[int]:
        st = t.stride()
        return [st[0], st[1], st[2]] if fmt == "bhsd" else [st[0], st[2], st[1]]

    want_sc = [0, 0]
    if source == "table" and angle is not None:
        want_sc = [angle.stride(0), 0]
    elif source == "cache" and angle is not None:
        want_sc = list(angle.stride()[:2])
    want_pos = [1, 0, 0] if source == "cache" else [1, positions.stride(0), positions.stride(1)]
    assert got == [S, Hq, Hkv, want_pos[0], *bhs(q), *bhs(k), *bhs(q), *bhs(k), *want_sc, *want_pos[1:]]
    assert launch_grid(fmt, q.shape, k.shape, 4) == (B * S, 2 + 1)


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"rotary_dim": 7}, "even"),
        ({"rotary_dim": 256}, "exceeds head_dim"),
        ({"rotary_dim": 64, "interleaved": 2}, "interleaved must be 0"),
        ({"rotary_dim": 64, "qk_format": 3}, "qk_format"),
        ({"rotary_dim": 64, "position_mode": 5}, "position_mode"),
    ],
)
def test_bad_plugin_attributes_fail_the_build(attrs: dict, message: str) -> None:
    with pytest.raises(BuildError, match=message):
        spec_for_build("table", attrs, head_dim=128)


def test_unsupported_dtype_fails_the_build() -> None:
    spec = RopeKernelSpec("table", 64, 64)
    with pytest.raises(BuildError, match=r"float64.*float32"):
        compile_rope_ptx(spec, arch=90, qk_dtype="float64", table_dtype="float32")
    with pytest.raises(BuildError, match="cos/sin"):
        compile_rope_ptx(spec, arch=90, qk_dtype="float16", table_dtype="int8")
