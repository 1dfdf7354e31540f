#!/usr/bin/env python
"""What a GPU can prove of posenc, in one call of a few minutes on a machine with an NVIDIA GPU.

Sections (each row of the report says what ran, what it measured, or why it was skipped):

1. ``environment``: GPU, compute capability, torch / triton / onnxruntime / tensorrt versions.
2. ``kernel-parity``: the Triton RoPE kernel (``posenc.plugins.rope``) JIT-compiled for this GPU, every angle source
   (table, in-kernel frequencies, dynamic NTK, multi-axis M-RoPE), both layouts, partial rotary, fp32/fp16/bf16,
   against posenc's float64 scheme rotation (``PositionalScheme.rotate`` of a float64 build), positions up to 131071,
   held to the scheme's tolerance of the activation dtype (``posenc.validate.tolerance``).
3. ``kernel-bandwidth``: ``posenc.bench.rope_kernel.run_benchmark`` — the kernel (every tactic) against a device
   copy measured in the same run (Llama-3-8B prefill: fraction of copy bandwidth; decode: µs per launch), with a
   torch eager ``rotate_half`` baseline.
4. ``eager-half``: posenc's ``AttentionBlock`` of every registered scheme run on the GPU in fp16 and bf16 (weights
   and activations in that dtype, tables float32, as exported) against the float64 block on the CPU with the same
   weights, at a prefill, a decode step over a cache and positions at the end of the table; held to the scheme's
   tolerance of the dtype (the same rule every posenc verdict uses).
5. ``tensorrt``: the engine matrix through polygraphy's ``TrtRunner`` — only where datacenter TensorRT is
   importable; otherwise skipped with the reason (``--trt`` forces the attempt).

Writes ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` and keeps going after a failure. Exit 0 when every row that
ran passed, 1 when one failed, 2 when no GPU is visible (``--device cpu`` runs sections 2-4 on the CPU under
Triton's interpreter as a smoke test of this script; its numbers mean nothing). Usage::

    python scripts/gpu_check.py -o gpu-report                  # on the GPU machine (about 1-4 minutes on an H100)

It imports posenc from ``src/`` and, where the GPU machine has no polygraphy, from ``.gpu-deps/`` (a copy of the
venv's pure-Python ``polygraphy`` package, carried with the checkout).
    python scripts/gpu_check.py --device cpu --quick -o /tmp/g # this script's own smoke run, no GPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Runnable from a bare checkout: posenc from src/, and pure-Python packages the GPU machine lacks (polygraphy) from
# .gpu-deps/ when one was carried there (`cp -r .venv/lib/python3.*/site-packages/polygraphy .gpu-deps/`).
for _extra in (ROOT / "src", ROOT / ".gpu-deps"):
    if _extra.is_dir() and str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))


def environment(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(), "device": device}
    for name in ("torch", "triton", "onnxruntime", "onnx", "transformers", "polygraphy", "tensorrt", "posenc"):
        try:
            info[name] = __import__(name).__version__
        except Exception as exc:  # report what is missing, keep going
            info[name] = f"unavailable ({type(exc).__name__}: {exc})"
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, compute_capability=f"sm{props.major}{props.minor}", sms=props.multi_processor_count)
    return info


def held_to(pairs: list[tuple[Any, Any, Any]]) -> dict[str, Any]:
    """The verdict of ``(got, float64 reference, Tolerance)`` tensors by posenc's one rule
    (``posenc.validate.tolerance.outside_tolerance``): status, worst error, the tolerance of the first pair, and the
    worst fraction of the allowed error (max |err| / max(atol, rtol·|ref|); below 1 passes)."""
    import torch

    from posenc.validate.tolerance import outside_tolerance

    worst, fails, margin = 0.0, 0, 0.0
    for got, want, tol in pairs:
        got64 = got.detach().float().cpu().double()
        err = (got64 - want).abs()
        worst = max(worst, float(err.max()))
        fails += int(outside_tolerance(got64.numpy(), want.numpy(), tol).sum())
        allowed = torch.maximum(torch.full_like(want, tol.atol), tol.rtol * want.abs())
        margin = max(margin, float((err / allowed).max()))
    tol = pairs[0][2]
    return {
        "status": "pass" if fails == 0 else "FAIL",
        "max_abs": worst,
        "atol": tol.atol,
        "rtol": tol.rtol,
        "worst_fraction_of_tolerance": margin,
        "failing_elements": fails,
    }


# --------------------------------------------------------------------------------------------------
# 2. kernel parity
# --------------------------------------------------------------------------------------------------

KERNEL_CASES: list[tuple[str, str, dict[str, Any], str, int]] = [
    # (row name, scheme, params, angle source, first position of the 37-token window)
    ("rope half, table", "rope", {}, "table", 4000),
    (
        "rope interleaved partial 0.5, table",
        "rope",
        {"layout": "interleaved", "partial_rotary_factor": 0.5},
        "table",
        60,
    ),
    ("rope theta 5e5, in-kernel freq", "rope", {"rope_theta": 500000.0}, "freq", 131035),
    (
        "yarn x8 of 8192, in-kernel freq",
        "rope_yarn",
        {"factor": 8.0, "original_max_position_embeddings": 8192},
        "freq",
        131035,
    ),
    (
        "llama3 x8 of 8192, in-kernel freq",
        "rope_llama3",
        {"factor": 8.0, "original_max_position_embeddings": 8192},
        "freq",
        131035,
    ),
    ("dynamic NTK x4 of 4096, in-kernel", "rope_dynamic", {"factor": 4.0}, "ntk", 131035),
    ("M-RoPE (Qwen2-VL sections), table", "rope_mrope", {"mrope_section": [16, 24, 24]}, "table", 3000),
]
KERNEL_POSITIONS = 131072


def kernel_parity(device: str, quick: bool) -> list[dict[str, Any]]:
    import torch

    from posenc import AttentionConfig, build_scheme, functional
    from posenc.plugins.rope import RopeKernelSpec, freq_inputs, rope_qk
    from posenc.schemes.rope import rope_parameters
    from posenc.validate.tolerance import tolerance_for

    heads, kv_heads, seq = (4, 2, 5) if quick else (8, 2, 37)
    config = AttentionConfig(
        hidden_size=heads * 128,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=128,
        max_position_embeddings=KERNEL_POSITIONS,
    )
    dtypes = (torch.float32, torch.bfloat16) if quick else (torch.float32, torch.float16, torch.bfloat16)
    rows = []
    for name, scheme_name, params, source, start in KERNEL_CASES[: 3 if quick else None]:
        scheme_params = dict(params)
        if scheme_name == "rope_dynamic":
            scheme_params.setdefault("factor", 4.0)
            config_case = AttentionConfig(**{**config.to_dict(), "max_position_embeddings": 4096})
        else:
            config_case = config
        try:
            scheme = build_scheme(scheme_name, config_case, scheme_params, "dynamic", table_dtype=torch.float64)
            rope = rope_parameters(scheme.rope_type, scheme.params, config_case)
            r, layout = scheme.rotary_dim, scheme.layout
            axes = scheme.spec.position_axes
            batch = 2
            positions = torch.arange(start, start + seq).expand(batch, seq)
            if axes > 1:  # M-RoPE: the temporal axis runs on, height and width move on a grid
                positions = torch.stack([positions, positions // 7, positions % 7])
            inputs: dict[str, Any] = {}
            spec_args: dict[str, Any] = {"layout": layout}
            if axes > 1:
                slot_axes = scheme.axis_select.reshape(axes, -1).argmax(0)
                spec_args["mrope_section"] = tuple(int((slot_axes == a).sum()) for a in range(axes))
            if source == "table":
                inv_freq, _ = functional.rope_inv_freq(r, rope)
                rows_needed = int(positions.max()) + 1
                inputs["cos"], inputs["sin"] = functional.rope_cos_sin(torch.arange(rows_needed), inv_freq)
            elif source == "freq":
                turns, extra = freq_inputs(r, rope)
                inputs["turns"] = turns
                spec_args.update(extra)
            else:
                spec_args.update(
                    rope_theta=rope["rope_theta"],
                    factor=rope["factor"],
                    max_position_embeddings=rope["max_position_embeddings"],
                )
            spec = RopeKernelSpec(source, r, 128, **spec_args)
        except Exception as exc:
            rows.append({"case": name, "status": "error", "error": f"{type(exc).__name__}: {exc}"})
            continue
        for dtype in dtypes:
            row: dict[str, Any] = {"case": name, "dtype": str(dtype).removeprefix("torch.")}
            try:
                q = torch.randn(batch, seq, heads, 128, dtype=dtype).transpose(1, 2)  # BSHD storage, as after q_proj
                k = torch.randn(batch, kv_heads, seq, 128, dtype=dtype)
                want_q, want_k = scheme.rotate(q.double(), k.double(), positions)
                moved = {key: value.to(device) for key, value in inputs.items()}
                got_q, got_k = rope_qk(q.to(device), k.to(device), spec, positions=positions.to(device), **moved)
                tol = tolerance_for(scheme.spec, dtype, "q_rot")
                row.update(held_to([(got_q, want_q, tol), (got_k, want_k, tol)]))
                row["positions"] = f"{int(positions.min())}..{int(positions.max())}"
            except Exception as exc:
                row.update(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
            rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------------
# 3. kernel bandwidth
# --------------------------------------------------------------------------------------------------


def kernel_bandwidth(device: str, quick: bool) -> dict[str, Any]:
    from posenc.bench.rope_kernel import SMOKE_CASES, format_table, run_benchmark
    from posenc.records import to_json

    if device == "cpu":
        doc = run_benchmark(list(SMOKE_CASES), device="cpu", iters=2, tactics=False)
    else:
        doc = run_benchmark(device=device, iters=20 if quick else 50, tactics=not quick)
    return {"status": "ok", "table": format_table(doc), "document": to_json(doc)}


# --------------------------------------------------------------------------------------------------
# 4. eager block in fp16 / bf16
# --------------------------------------------------------------------------------------------------

EAGER_SHAPES = (("prefill", 2, 33, 0), ("decode step", 2, 1, 31), ("table end", 1, 8, -1))
"""(name, batch, new tokens, past); past -1: the window ends at the last position of the table."""


def eager_half(device: str, quick: bool, schemes: list[str] | None) -> list[dict[str, Any]]:
    import torch

    from posenc import AttentionConfig
    from posenc.blocks import build_block
    from posenc.errors import PosencError
    from posenc.export.checks import check_dtype
    from posenc.export.eager import load_weights
    from posenc.schemes import get_spec, scheme_names
    from posenc.schemes.base import table_keys

    config = AttentionConfig(hidden_size=256, num_heads=8, num_kv_heads=2, max_position_embeddings=512)
    names = schemes or list(scheme_names())
    if quick:
        names = names[:4]
    cases = [(name, name, config) for name in names]
    if not quick and not schemes:  # today's attention features, on RoPE
        for label, features in FEATURE_CASES.items():
            cases.append((f"rope+{label}", "rope", AttentionConfig(**{**config.to_dict(), **features})))
    rows = []
    for label, name, case_config in cases:
        spec = get_spec(name)
        try:
            torch.manual_seed(0)
            block = build_block(case_config, name).eval()
            reference = build_block(case_config, name, table_dtype=torch.float64).to(torch.float64).eval()
            load_weights(reference, block.state_dict(), sorted(table_keys(block)))
        except PosencError as exc:
            rows.append({"scheme": label, "status": "error", "error": str(exc)})
            continue
        for dtype in (torch.float16, torch.bfloat16):
            dname = str(dtype).removeprefix("torch.")
            try:
                check_dtype(dtype, name)
            except PosencError as exc:
                rows.append({"scheme": label, "dtype": dname, "status": "skipped", "reason": str(exc)})
                continue
            half = build_block(case_config, name).eval()
            half.load_state_dict(block.state_dict())
            half = half.to(device=device, dtype=dtype)
            for shape_name, batch, seq, past in EAGER_SHAPES:
                row = _eager_row(name, spec, half, reference, dtype, shape_name, batch, seq, past, case_config)
                rows.append({**row, "scheme": label})
    return rows


FEATURE_CASES: dict[str, dict[str, Any]] = {
    "sinks": {"attention_sinks": True},
    "gate": {"output_gate": "sigmoid"},
    "full-width-qk-norm": {"qk_norm": "rms", "qk_norm_full_width": True},
    "softcap+window": {"logit_softcap": 30.0, "sliding_window": 16},
}
"""Block features of today's models (gpt-oss sinks, Qwen3-Next gates, OLMo 2 norms, Gemma 2 caps and windows)."""


def _eager_row(
    name: str,
    spec: Any,
    half: Any,
    reference: Any,
    dtype: Any,
    shape_name: str,
    batch: int,
    seq: int,
    past: int,
    config: Any,
) -> dict[str, Any]:
    import torch

    from posenc.validate.tolerance import tolerance_for

    row: dict[str, Any] = {"scheme": name, "dtype": str(dtype).removeprefix("torch."), "shape": shape_name}
    try:
        generator = torch.Generator().manual_seed(1)
        hidden = torch.randn(batch, seq, config.hidden_size, generator=generator, dtype=torch.float64)
        axes = spec.position_axes
        position_ids = None
        past_kv: tuple[Any, ...] = ()
        if past > 0:
            shape = (batch, config.num_kv_heads, past, config.head_dim)
            past_kv = tuple(torch.randn(*shape, generator=generator, dtype=torch.float64) for _ in range(2))
        elif past < 0:
            start = config.max_position_embeddings - seq
            ids = torch.arange(start, start + seq).expand(batch, seq)
            position_ids = ids if axes == 1 else ids.expand(axes, batch, seq)
        # both sides see the same inputs: rounded to the half dtype once, as a deployed graph is fed
        hidden = hidden.to(dtype).double()
        past_kv = tuple(t.to(dtype).double() for t in past_kv)
        with torch.no_grad():
            want = reference(hidden, position_ids, *past_kv)
            got = half(
                hidden.to(device=_device_of(half), dtype=dtype),
                None if position_ids is None else position_ids.to(_device_of(half)),
                *(t.to(device=_device_of(half), dtype=dtype) for t in past_kv),
            )
        outputs = ("out", "present_key", "present_value")
        row.update(held_to([(g, w, tolerance_for(spec, dtype, o)) for o, g, w in zip(outputs, got, want, strict=True)]))
    except Exception as exc:
        row.update(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    return row


def _device_of(module: Any) -> Any:
    return next(module.parameters()).device


# --------------------------------------------------------------------------------------------------
# 5. TensorRT engines (datacenter TensorRT only)
# --------------------------------------------------------------------------------------------------


def tensorrt_engines(out: Path, quick: bool, schemes: list[str] | None, backend: str = "tensorrt") -> dict[str, Any]:
    """Build every matrix case and hold its engine to the float64 eager reference through polygraphy's TrtRunner
    (datacenter TensorRT); ``tensorrt_rtx`` builds them ahead of time for sm89 only (it cannot run them here)."""
    from posenc import AttentionConfig
    from posenc.engine import build_engine, engine_runner
    from posenc.errors import PosencError
    from posenc.export import FeedShape
    from posenc.validate import check_ort_parity, validate_onnx

    sys.path.insert(0, str(ROOT))  # the test suite's engine matrix
    from tests.matrix import graph_for, matrix_cases

    config = AttentionConfig(hidden_size=256, num_heads=8, num_kv_heads=4, max_position_embeddings=256)
    shapes = [FeedShape(1, 1), FeedShape(2, 7), FeedShape(1, 64), FeedShape(4, 33)]
    folder = out / "engines"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in matrix_cases(units=("op",) if quick else ("op", "block"), schemes=schemes):
        row: dict[str, Any] = {"case": case.id}
        try:
            onnx_path = graph_for(case, folder, config, check=check_ort_parity)
            targets = ["sm89"] if backend == "tensorrt_rtx" else None
            engine = build_engine(onnx_path, folder / f"{case.id}.engine", targets=targets, backend=backend)
            if backend == "tensorrt_rtx":
                row.update(status="pass", note="built ahead of time (not run)", layers=engine.manifest.layers)
                rows.append(row)
                continue
            report = validate_onnx(onnx_path, shapes=shapes, runners=[engine_runner(engine.path)])
            row.update(
                status="pass" if report.passed else "FAIL", max_abs=max((r.max_abs for r in report.rows), default=0)
            )
        except PosencError as exc:
            row.update(status="FAIL", error=str(exc))
        except Exception as exc:
            row.update(status="error", error=f"{type(exc).__name__}: {exc}")
        rows.append(row)
    return {"status": "ok", "rows": rows}


# --------------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------------


def run_section(name: str, fn: Callable[[], Any], report: dict[str, Any], deadline: float) -> None:
    if time.monotonic() > deadline:
        report[name] = {"status": "skipped", "reason": "the time budget (--budget-s) ran out before this section"}
        return
    started = time.monotonic()
    try:
        result = fn()
        report[name] = result if isinstance(result, dict) else {"status": "ok", "rows": result}
    except Exception as exc:  # a section's crash is a row of the report, not the end of the run
        report[name] = {
            "status": "error",
            "reason": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    report[name]["seconds"] = round(time.monotonic() - started, 1)
    print(f"[{name}] {report[name].get('status')} in {report[name]['seconds']} s", flush=True)


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        "# posenc GPU check",
        "",
        f"GPU: {env.get('gpu')} ({env.get('compute_capability')}), device {env['device']}",
    ]
    lines += [", ".join(f"{k} {env.get(k)}" for k in ("torch", "triton", "onnxruntime", "tensorrt")), ""]
    for section, columns in (
        ("kernel-parity", ("case", "dtype", "positions", "status", "max_abs", "atol", "worst_fraction_of_tolerance")),
        ("eager-half", ("scheme", "dtype", "shape", "status", "max_abs", "atol", "worst_fraction_of_tolerance")),
    ):
        data = report.get(section, {})
        lines += [f"## {section} ({data.get('status')}, {data.get('seconds')} s)", ""]
        if data.get("reason"):
            lines += [str(data["reason"]), ""]
        rows = data.get("rows", [])
        if rows:
            passed = sum(r.get("status") == "pass" for r in rows)
            lines += [
                f"{passed}/{len(rows)} rows pass (worst_fraction_of_tolerance: max |err| / allowed, < 1 passes)",
                "",
            ]
            lines += ["| " + " | ".join(columns) + " | note |", "|" + "---|" * (len(columns) + 1)]
            for r in rows:
                note = (r.get("error") or r.get("reason") or "").replace("|", "/")[:140]
                lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + f" | {note} |")
            lines.append("")
    bandwidth = report.get("kernel-bandwidth", {})
    lines += [f"## kernel-bandwidth ({bandwidth.get('status')}, {bandwidth.get('seconds')} s)", "", "```"]
    lines += [bandwidth.get("table") or str(bandwidth.get("reason")), "```", ""]
    trt = report.get("tensorrt", {})
    lines += [f"## tensorrt ({trt.get('status')})", "", str(trt.get("reason", "")), ""]
    for r in trt.get("rows", []):
        lines.append(f"- {r['case']}: {r.get('status')} {r.get('error', '')}")
    return "\n".join(lines) + "\n"


def failures(report: dict[str, Any]) -> list[str]:
    bad = []
    for section in ("kernel-parity", "eager-half", "kernel-bandwidth", "tensorrt"):
        data = report.get(section, {})
        if data.get("status") == "error":
            bad.append(section)
        bad += [f"{section}: {r}" for r in data.get("rows", []) if r.get("status") in ("FAIL", "error")]
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", default="gpu-report", help="report folder")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: smoke run (interpreter)")
    parser.add_argument("--quick", action="store_true", help="fewer cases (a smoke run)")
    parser.add_argument("--schemes", nargs="+", help="eager-half and tensorrt: these schemes only")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip sections that start after this")
    parser.add_argument("--trt", action="store_true", help="attempt the TensorRT section even if it looks absent")
    parser.add_argument(
        "--rtx", action="store_true", help="the TensorRT section with tensorrt_rtx: the matrix built for sm89, not run"
    )
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    import torch

    if args.device == "cuda" and not torch.cuda.is_available() and not args.rtx:
        print(
            "gpu_check: no NVIDIA GPU visible (torch.cuda.is_available() is False); --device cpu smoke-tests "
            "this script.",
            file=sys.stderr,
        )
        return 2
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    report: dict[str, Any] = {"environment": environment(args.device)}
    if args.rtx and args.device == "cuda" and not torch.cuda.is_available():
        args.device = "cpu"  # ahead-of-time builds only: the kernel and eager sections run as a smoke test
        os.environ.setdefault("TRITON_INTERPRET", "1")
    run_section("kernel-parity", lambda: kernel_parity(args.device, args.quick), report, deadline)
    run_section("eager-half", lambda: eager_half(args.device, args.quick, args.schemes), report, deadline)
    run_section("kernel-bandwidth", lambda: kernel_bandwidth(args.device, args.quick), report, deadline)
    import importlib.util

    if args.rtx:
        run_section(
            "tensorrt", lambda: tensorrt_engines(out, args.quick, args.schemes, "tensorrt_rtx"), report, deadline
        )
    elif importlib.util.find_spec("tensorrt") is None and not args.trt:
        report["tensorrt"] = {
            "status": "skipped",
            "reason": "datacenter TensorRT (`tensorrt`) is not importable here: engines are neither built nor run "
            "(TensorRT-RTX builds them ahead of time without a GPU: `posenc build --backend tensorrt_rtx`).",
        }
    elif args.device == "cuda":
        run_section("tensorrt", lambda: tensorrt_engines(out, args.quick, args.schemes), report, deadline)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "gpu_check.md").write_text(markdown(report))
    print(markdown(report))
    bad = failures(report)
    for line in bad:
        print(f"FAILED {line}"[:400], file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
