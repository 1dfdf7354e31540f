#!/usr/bin/env python
"""Every GPU check of posenc in one go, for a machine with an NVIDIA GPU and datacenter TensorRT.

1. environment: GPU, compute capability, tensorrt / onnxruntime / torch versions;
2. builds: the engine matrix with datacenter TensorRT (every scheme x table mode x dtype x {decomposed,
   fused}; op-level, and block-level unless ``--quick``);
3. parity: each built engine through polygraphy's TrtRunner against the float64 eager reference
   (``posenc validate`` machinery) at several shapes;
4. benchmarks: ``posenc bench`` on the GPU backends present (skipped with ``--no-bench``);
5. decode: the in-place KV cache (``--kv-cache inplace``) against the concatenated one on ONNX Runtime CUDA (the
   exported graphs and the ``ort-cuda`` graphs: contrib ``GroupQueryAttention`` over the shared buffer) and on
   TensorRT (KV-cache update layers, cache and present on one device buffer): one decode step of the Llama-like
   block at past 4095 against its bytes floor, both layouts in the same rounds; and multi-step decode parity of
   the ``ort-cuda`` graphs on the CUDA provider (prefill, 64 single steps, a long jump) against the eager block
   (skipped with ``--no-decode``). Untested on a GPU when written: no GPU was lent to that work.

Writes one report, ``OUT/gpu_check.json`` and ``OUT/gpu_check.md``, and keeps going after a failure (each
row says what failed). Usage::

    pip install -e ".[trt]"            # on the GPU machine
    python scripts/gpu_check.py -o gpu-report
    python scripts/gpu_check.py --quick --schemes rope alibi -o gpu-report
    python scripts/gpu_check.py --backend tensorrt_rtx -o rtx-report     # whole matrix ahead of time, no GPU

A thin driver: builds, runner and parity are posenc's (posenc.engine, posenc.validate, posenc.bench); the engine
matrix is the test suite's (tests/matrix.py), so run it from a checkout of the repository.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from posenc import AttentionConfig
from posenc.bench.plan import resolve_schemes
from posenc.engine import build_engine, engine_runner, load_backend
from posenc.engine.targets import current_gpu_target
from posenc.errors import PosencError
from posenc.export import FeedShape

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for the test suite's matrix
from tests.matrix import graph_for, matrix_cases

CONFIG = AttentionConfig(hidden_size=256, num_heads=8, num_kv_heads=4, max_position_embeddings=256)
SHAPES = [FeedShape(1, 1), FeedShape(2, 7), FeedShape(1, 64), FeedShape(4, 33)]
BLOCK_SHAPES = [*SHAPES, FeedShape(2, 1, 17)]


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    for name in ("torch", "onnxruntime", "onnx", "polygraphy", "tensorrt", "tensorrt_rtx", "posenc"):
        try:
            info[name] = __import__(name).__version__
        except Exception as exc:  # report what is missing, keep going
            info[name] = f"unavailable ({type(exc).__name__}: {exc})"
    try:
        import torch

        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        info["gpu"] = None
    info["compute_capability"] = current_gpu_target()
    return info


def check_case(case: Any, folder: Path, skip_parity: bool, backend: str = "tensorrt") -> dict[str, Any]:
    row: dict[str, Any] = {"case": case.id}
    started = time.perf_counter()
    try:
        from posenc.validate import check_ort_parity

        onnx_path = graph_for(case, folder, CONFIG, check=check_ort_parity)
        targets = ["sm89"] if backend == "tensorrt_rtx" else None
        engine = build_engine(onnx_path, folder / f"{case.id}.engine", targets=targets, backend=backend)
        row.update(build="ok", build_seconds=engine.manifest.build_seconds, layers=engine.manifest.layers)
    except PosencError as exc:
        row.update(build="failed", error=str(exc))
        return row
    except Exception as exc:  # unexpected: record the traceback and continue with the next case
        row.update(build="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        return row
    if skip_parity:
        return row
    try:
        from posenc.validate import validate_onnx

        shapes = BLOCK_SHAPES if case.unit == "block" else SHAPES
        report = validate_onnx(onnx_path, shapes=shapes, runners=[engine_runner(engine.path)])
        worst = max((r.max_abs for r in report.rows), default=0.0)
        row.update(parity="passed" if report.passed else "FAILED", worst_abs_error=worst)
        if not report.passed:
            row["parity_report"] = report.to_markdown()
    except Exception as exc:
        row.update(parity="error", error=f"{type(exc).__name__}: {exc}")
    row["seconds"] = round(time.perf_counter() - started, 2)
    return row


def benchmarks(schemes: list[str] | None, out: Path) -> dict[str, Any]:
    try:
        from posenc.bench import RunSettings, get_backends, make_plan, run_bench
    except ImportError as exc:
        return {"status": "skipped", "reason": f"posenc.bench unavailable ({exc})"}
    names = [b.name for b in get_backends(None)]
    gpu = [n for n in names if n in ("tensorrt", "ort-cuda", "ort-cuda-fused", "torch")]
    try:
        doc = run_bench(make_plan(schemes, backends=gpu), RunSettings(), out / "bench", progress=False)
    except Exception as exc:
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}", "backends": gpu}
    return {"status": "ok", "backends": gpu, "records": len(doc.records), "folder": str(out / "bench")}


DECODE_BACKENDS = ("ort-cuda", "ort-cuda-fused", "tensorrt")
DECODE_CONFIG = AttentionConfig(hidden_size=256, num_heads=8, num_kv_heads=2, max_position_embeddings=128)
"""Multi-step decode parity: grouped heads, head_dim 32 (GroupQueryAttention needs a multiple of 16), 128 slots."""


def decode_figures(schemes: list[str] | None, out: Path) -> dict[str, Any]:
    """The decode step at past 4095 (both cache layouts, same rounds) on the GPU backends, and decode parity on CUDA."""
    try:
        from posenc.bench import RunSettings, run_bench
        from posenc.bench.plan import DECODE_TARGET_SHAPE, LLAMA_LIKE, BenchCase, table_modes_for
        from posenc.bench.tables import decode_rows, markdown_table
    except ImportError as exc:
        return {"status": "skipped", "reason": f"posenc.bench unavailable ({exc})"}
    chosen = schemes or ["rope"]
    cases = [
        BenchCase(s, "block", mode, DECODE_TARGET_SHAPE, LLAMA_LIKE, DECODE_BACKENDS, reason, ("block-inplace",))
        for s in chosen
        for mode, reason in table_modes_for(s, "auto")
    ]
    result: dict[str, Any] = {"backends": list(DECODE_BACKENDS)}
    try:
        doc = run_bench(cases, RunSettings(), out / "decode", progress=False)
        result.update(status="ok", table=markdown_table(*decode_rows(doc)), folder=str(out / "decode"))
    except Exception as exc:
        result.update(status="error", reason=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    result["parity"] = [decode_parity(scheme, out / "decode-parity") for scheme in chosen]
    return result


def decode_parity(scheme: str, folder: Path) -> dict[str, Any]:
    """Multi-step decode parity of one scheme's concat and in-place fp16 graphs (exported and ``ort-cuda``) on CUDA
    (ONNX Runtime's CUDA GroupQueryAttention kernel takes fp16 and bf16; an fp32 graph runs it on the CPU)."""
    from posenc.export import export_onnx
    from posenc.graphs import optimize_file
    from posenc.validate import check_ort_parity
    from posenc.validate.decode import validate_decode

    folder.mkdir(parents=True, exist_ok=True)
    try:
        paths = []
        for layout in ("concat", "inplace"):
            path = folder / f"{scheme}-{layout}.onnx"
            export_onnx(path, scheme, kv_cache=layout, config=DECODE_CONFIG, dtype="float16")  # CUDA GQA: fp16
            paths.append(path)
            optimized = folder / f"{scheme}-{layout}.ort-cuda.onnx"
            optimize_file(path, optimized, "ort-cuda", check=check_ort_parity)
            paths.append(optimized)
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        jump = "fill" if scheme == "transformer_xl" else "position"
        report = validate_decode(paths, jump=jump, providers=providers)
        (folder / f"{scheme}.md").write_text(report.to_markdown())
        worst = max((r.max_abs for r in report.rows), default=0.0)
        return {"scheme": scheme, "passed": report.passed, "steps": len(report.schedule), "worst_abs_error": worst}
    except Exception as exc:
        return {"scheme": scheme, "passed": False, "error": f"{type(exc).__name__}: {exc}"}


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    versions = f"TensorRT {env.get('tensorrt')}; torch {env.get('torch')}; onnxruntime {env.get('onnxruntime')}"
    lines = ["# posenc GPU check", "", f"GPU: {env.get('gpu')} ({env.get('compute_capability')}); {versions}", ""]
    rows = report["cases"]
    built = sum(r.get("build") == "ok" for r in rows)
    passed = sum(r.get("parity") == "passed" for r in rows)
    checked = sum("parity" in r for r in rows)
    parity = f"parity passed: {passed}/{checked}" if checked else "parity: not run"
    lines += [f"Engines built: {built}/{len(rows)} ({env.get('backend')}); {parity}", ""]
    lines += ["| case | build | parity | worst abs error | note |", "|---|---|---|---|---|"]
    for r in rows:
        note = (r.get("error") or "").replace("|", "/")[:160]
        lines.append(
            f"| {r['case']} | {r.get('build')} | {r.get('parity', '-')} | {r.get('worst_abs_error', '-')} | {note} |"
        )
    lines += ["", f"Benchmarks: {json.dumps(report['benchmarks'])}", ""]
    decode = report.get("decode", {"status": "skipped"})
    lines += ["## Decode: in-place vs concatenated KV cache (GPU)", ""]
    lines += [decode.get("table") or f"status: {decode.get('status')} {decode.get('reason', '')}", ""]
    for row in decode.get("parity", []):
        verdict = "PASS" if row.get("passed") else "FAIL"
        lines.append(f"- decode parity {row['scheme']} on CUDA: {verdict} {row.get('error', '')}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", default="gpu-report", help="report folder")
    parser.add_argument("--schemes", nargs="+", help="restrict to these schemes (default: all)")
    parser.add_argument("--quick", action="store_true", help="op-level graphs only")
    parser.add_argument("--no-parity", action="store_true", help="build only")
    parser.add_argument("--no-bench", action="store_true", help="skip benchmarks")
    parser.add_argument("--no-decode", action="store_true", help="skip the in-place KV cache decode figures")
    parser.add_argument(
        "--backend",
        default="tensorrt",
        choices=["tensorrt", "tensorrt_rtx"],
        help="tensorrt_rtx: ahead-of-time builds of the whole matrix for sm89 on any machine (implies --no-parity)",
    )
    args = parser.parse_args(argv)
    try:
        args.schemes = resolve_schemes(args.schemes) if args.schemes else None  # unknown names fail before work
    except PosencError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    out = Path(args.output)
    (out / "graphs").mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"environment": environment(), "cases": [], "benchmarks": {"status": "skipped"}}
    report["environment"]["backend"] = args.backend
    rtx = args.backend == "tensorrt_rtx"
    try:
        load_backend(args.backend)
    except PosencError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    if rtx:
        args.no_parity = args.no_bench = args.no_decode = True  # RTX engines cannot run without an RTX-class GPU here
    elif report["environment"]["compute_capability"] is None:
        print("gpu_check: no NVIDIA GPU visible (needs a CUDA build of torch and a driver).", file=sys.stderr)
        return 2
    units = ("op",) if args.quick else ("op", "block")
    cases = matrix_cases(units=units, schemes=args.schemes)
    for index, case in enumerate(cases, 1):
        row = check_case(case, out / "graphs", args.no_parity, args.backend)
        report["cases"].append(row)
        print(
            f"[{index}/{len(cases)}] {case.id}: build {row.get('build')}, parity {row.get('parity', '-')}", flush=True
        )
    if not args.no_bench:
        report["benchmarks"] = benchmarks(args.schemes, out)
    if not args.no_decode:
        report["decode"] = decode_figures(args.schemes, out)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "gpu_check.md").write_text(markdown(report))
    print(f"wrote {out / 'gpu_check.md'} and {out / 'gpu_check.json'}")
    failed = [r for r in report["cases"] if r.get("build") != "ok" or r.get("parity") in ("FAILED", "error")]
    failed += [r for r in report.get("decode", {}).get("parity", []) if not r.get("passed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
