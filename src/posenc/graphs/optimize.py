"""The optimization pipeline: which passes run for which target, parity before/after, files out.

Targets:

- ``ort-cpu``: RoPE fused into ``RotaryEmbedding`` on the 3-D ``[B, S, H*D]`` projection output where the
  graph has a head transpose (ONNX Runtime's CPU kernel is several times faster there), attention into
  ``Attention``; precision as exported (float32 rotation and softmax inside the casts of fp16 graphs).
- ``trt``: ``RotaryEmbedding`` on 4-D ``[B, H, S, D]`` with caches in the activation dtype and int64
  full-batch position ids (TensorRT's native layer), ``Attention`` with causality folded into the mask.

RoPE handling (``rope``): ``fused`` (standard op), ``plugin`` (posenc's TensorRT plugin node, see
:mod:`posenc.graphs.rope_plugin`), ``keep`` (leave the decomposed rotation alone).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from posenc.errors import ConfigError, ModelFileError, ParityError
from posenc.export.files import atomic_outputs, json_text
from posenc.graphs import attention, fold, model_io, rope
from posenc.graphs.choices import DEFAULT_FOLD_LIMIT, ROPE_MODES, TARGETS
from posenc.graphs.manifests import ModelInfo, optimized_manifest, read_model_info

MIN_FUSION_OPSET = 23
PARITY_SHAPE = (2, 5, 0)
"""(batch, seq, past) of the parity feed: sizes unlike the export sample, so dynamic dims are exercised."""


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """One pass of a run: its name, how many matches it rewrote, and why it did not run (if it did not)."""

    name: str
    count: int
    skipped: str = ""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "count": self.count}
        if self.skipped:
            data["skipped"] = self.skipped
        return data


@dataclasses.dataclass
class OptimizeResult:
    """What :func:`optimize_model` / :func:`optimize_file` did.

    Attributes:
        model: the rewritten IR model.
        target: ``ort-cpu`` or ``trt``.
        rope: ``fused``, ``plugin`` or ``keep``.
        passes: every pass in order with its match count.
        parity: ``{output: {"max_abs_diff", "atol", "rtol"}}`` of the check before/after, when run.
        path: the written ONNX file (``optimize_file``).
        manifest_path: the manifest written beside it.
    """

    model: ir.Model
    target: str
    rope: str
    passes: list[PassRecord]
    parity: dict[str, dict[str, float]] | None = None
    path: Path | None = None
    manifest_path: Path | None = None

    @property
    def counts(self) -> dict[str, int]:
        return {p.name: p.count for p in self.passes}

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "rope": self.rope,
            "passes": [p.to_dict() for p in self.passes],
            "parity": self.parity,
        }


def check_target(target: str) -> str:
    if target not in TARGETS:
        raise ConfigError(f"unknown optimization target {target!r}; use one of {list(TARGETS)}.")
    return target


def check_rope_mode(mode: str) -> str:
    if mode not in ROPE_MODES:
        raise ConfigError(f"unknown --rope mode {mode!r}; use one of {list(ROPE_MODES)}.")
    return mode


def _plugin_pass(model: ir.Model) -> int:
    try:
        from posenc.graphs.rope_plugin import rope_to_plugin
    except ImportError as exc:
        raise ConfigError(
            f"--rope plugin needs posenc.graphs.rope_plugin, which could not be imported ({exc}); "
            f"use --rope fused, or install posenc with its plugin support."
        ) from None
    return int(rope_to_plugin(model, fuse_decomposed=False))


def _pass_plan(target: str, rope_mode: str) -> list[tuple[str, Callable[[ir.Model], int], bool]]:
    """``(name, pass, needs opset 23)`` in order."""
    plan: list[tuple[str, Callable[[ir.Model], int], bool]] = [
        ("convert_contrib_rope", rope.convert_contrib_rope, True)
    ]
    if rope_mode in ("fused", "plugin"):
        plan += [("fuse_rope", rope.fuse_rope, True), ("fuse_partial_rope", rope.fuse_partial_rope, True)]
    ort = target != "trt"  # TensorRT's parser rejects softmax_precision and softcap
    plan.append(("fuse_attention", lambda m: attention.fuse_attention(m, softmax_precision=ort, softcap=ort), True))
    if rope_mode == "fused" and target == "ort-cpu":
        plan.append(("rope_to_3d", rope.rope_to_3d, True))
    if rope_mode == "fused" and target == "trt":
        plan.append(("rope_for_tensorrt", rope.rope_for_tensorrt, True))
    if target == "trt":
        plan.append(("fold_causal_into_mask", attention.fold_causal_into_mask, True))
    if rope_mode == "plugin":
        plan.append(("rope_plugin", _plugin_pass, True))
    return plan


def optimize_model(
    model: ir.Model, target: str, rope_mode: str = "fused", fold_limit: int = DEFAULT_FOLD_LIMIT
) -> OptimizeResult:
    """Run the passes for ``target`` on ``model`` (in place).

    Args:
        model: the IR model (see :func:`posenc.graphs.model_io.load_model`).
        target: ``ort-cpu`` or ``trt``.
        rope_mode: ``fused``, ``plugin`` or ``keep``.
        fold_limit: largest constant (elements) constant folding may read or create.

    Returns:
        :class:`OptimizeResult` with every pass and its match count. Fusions need opset 23 (the
        standard ``RotaryEmbedding`` and ``Attention`` ops); on older opsets they are listed as skipped.
    """
    check_target(target)
    check_rope_mode(rope_mode)
    fold.infer_shapes(model)
    records = [PassRecord("fold_constants", fold.fold_constants(model, fold_limit))]
    opset = model_io.default_opset(model)
    for name, run, needs_opset in _pass_plan(target, rope_mode):
        if needs_opset and opset < MIN_FUSION_OPSET:
            records.append(PassRecord(name, 0, f"opset {opset} < {MIN_FUSION_OPSET}: re-export with opset 23 to fuse"))
            continue
        records.append(PassRecord(name, int(run(model))))
        fold.infer_shapes(model)
    records.append(PassRecord("cleanup", fold.cleanup(model)))
    return OptimizeResult(model=model, target=target, rope=rope_mode, passes=records)


# --------------------------------------------------------------------------------------------------
# Files: load, optimize, check parity on ONNX Runtime CPU, write model + manifest atomically
# --------------------------------------------------------------------------------------------------


def optimize_file(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    target: str,
    rope_mode: str = "fused",
    *,
    check_parity: bool = True,
    fold_limit: int = DEFAULT_FOLD_LIMIT,
) -> OptimizeResult:
    """Optimize an ONNX file for ``target`` and write it with its manifest (and weights) beside it.

    The manifest of ``source`` (from ``posenc export``) is carried over with the new hash and an
    ``optimized`` record (target, rope mode, each pass and its match count, parity before/after).

    Raises:
        ModelFileError: ``source`` is missing or not ONNX; ``output`` equals ``source``.
        ParityError: the optimized graph's outputs differ from the original's on ONNX Runtime CPU by more
            than the scheme's tolerance (nothing is written then).
    """
    source, output = Path(source), Path(output)
    if source.resolve() == output.resolve():
        raise ModelFileError(f"output {output} is the input file; write the optimized model to a new path.")
    info = read_model_info(source)
    model = model_io.load_model(source)
    original = model_io.model_to_proto(model).SerializeToString()
    result = optimize_model(model, target, rope_mode, fold_limit)
    optimized = model_io.model_to_proto(result.model).SerializeToString()
    if check_parity and _runs_on_ort(result.model):
        result.parity = check_ort_parity(original, optimized, info)
    weights = info.weights_path if info.weights_path is not None and info.weights_path.exists() else None
    new_weights = info.weights_path_for(output) if weights is not None else None
    copy = weights is not None and new_weights is not None and new_weights.resolve() != weights.resolve()
    manifest_path = info.manifest_path_for(output)
    payload = optimized_manifest(info, hashlib.sha256(optimized).hexdigest(), result.to_dict(), new_weights)
    # Model, manifest and weights land together (the model last), or none of them does.
    with atomic_outputs(output, manifest_path, *([new_weights] if copy else [])) as temps:
        temps[0].write_bytes(optimized)
        temps[1].write_text(json_text(payload))
        if copy:
            shutil.copyfile(weights, temps[2])  # type: ignore[arg-type]
    result.path, result.manifest_path = output, manifest_path
    return result


def _runs_on_ort(model: ir.Model) -> bool:
    """False when a node is in a domain ONNX Runtime cannot run without extra registration."""
    known = {"", "ai.onnx", "com.microsoft"} | {f.domain for f in model.functions.values()}
    return all(node.domain in known for node in model.graph)


def check_ort_parity(before: bytes, after: bytes, info: ModelInfo) -> dict[str, dict[str, float]]:
    """Run both serialized models on ONNX Runtime CPU with one feed; raise if an output moved.

    bf16 graphs run emulated (:func:`posenc.validate.bf16.emulate_bf16`: float32 arithmetic, bf16 rounding),
    since ONNX Runtime CPU has no bf16 kernels. The feed fits a short precomputed table.

    Returns:
        ``{output name: {"max_abs_diff", "atol", "rtol"}}``.

    Raises:
        ParityError: an output moved outside its tolerance (:func:`posenc.validate.tolerance.outside_tolerance`),
            or ONNX Runtime cannot run one of the graphs (use ``--no-parity`` and validate on the target).
    """
    import onnxruntime as ort

    from posenc.validate.tolerance import outside_tolerance

    models = [before, after]
    emulated = info.dtype == "bfloat16"
    if emulated:
        import onnx

        from posenc.validate.bf16 import emulate_bf16

        models = [emulate_bf16(onnx.load_from_string(m)).SerializeToString() for m in models]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        sessions = [ort.InferenceSession(m, options, providers=["CPUExecutionProvider"]) for m in models]
        feed = info.feed(sessions[0], _parity_shape(info))
        if emulated:  # bf16 values carried exactly as float32
            feed = {k: v.astype(np.float32) if v.dtype.kind == "f" or v.dtype.name == "bfloat16" else v
                    for k, v in feed.items()}  # fmt: skip
        names = [o.name for o in sessions[0].get_outputs()]
        reference, optimized = (s.run(names, feed) for s in sessions)
    except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidArgument, ...)
        raise ParityError(
            f"ONNX Runtime CPU could not run the graph before/after optimization ({type(exc).__name__}: "
            f"{str(exc)[:300]}); nothing was written. Optimize with --no-parity and validate on the target."
        ) from None
    report: dict[str, dict[str, float]] = {}
    for name, ref, got in zip(names, reference, optimized, strict=True):
        tol = info.tolerance(name)
        ref64, got64 = np.asarray(ref, dtype=np.float64), np.asarray(got, dtype=np.float64)
        if ref64.shape != got64.shape:
            raise ParityError(f"output {name!r} changed shape {ref64.shape} -> {got64.shape}; this is a pass bug.")
        diff = np.abs(got64 - ref64)
        report[name] = {
            "max_abs_diff": float(diff[np.isfinite(ref64)].max(initial=0.0)),
            "atol": tol.atol,
            "rtol": tol.rtol,
        }
        if outside_tolerance(got64, ref64, tol).any():
            raise ParityError(
                f"output {name!r} of the optimized graph differs from the original by "
                f"{report[name]['max_abs_diff']:.3g} "
                f"(tolerance atol={tol.atol:g}, rtol={tol.rtol:g}) on ONNX Runtime CPU; nothing was written. "
                f"Use --rope keep to skip the RoPE fusion, and report the graph."
            )
    return report


def _parity_shape(info: ModelInfo) -> tuple[int, int, int]:
    """:data:`PARITY_SHAPE`, shrunk to fit the manifest's precomputed table (past first, then seq)."""
    batch, seq, past = PARITY_SHAPE
    limit = info.manifest.max_positions if info.manifest is not None else None
    if limit is not None:
        seq = min(seq, limit)
        past = min(past, limit - seq)
    return batch, seq, past
