"""The optimization pipeline: which passes run for which target, parity before/after, files out.

Targets:

- ``ort-cpu``: RoPE fused into ``RotaryEmbedding`` on the 3-D ``[B, S, H*D]`` projection output where the
  graph has a head transpose (ONNX Runtime's CPU kernel is several times faster there), attention into
  ``Attention``; precision as exported (float32 rotation and softmax inside the casts of fp16 graphs).
- ``ort-cuda``: as ``ort-cpu`` without the CPU layouts; an in-place block's cache writes and attention become
  ONNX Runtime's contrib ``GroupQueryAttention`` over the shared cache buffer, rotary fused where it can
  (:func:`posenc.graphs.cache.gqa_over_cache`; what it cannot express keeps ``Attention``, the reason recorded).
- ``trt``: ``RotaryEmbedding`` on 4-D ``[B, H, S, D]`` with caches in the activation dtype and int64
  full-batch position ids (TensorRT's native layer), ``Attention`` with causality folded into the mask;
  interleaved rotations in attention blocks stay decomposed (reason recorded), as TensorRT-RTX fails to build
  blocks holding an interleaved ``RotaryEmbedding`` (:data:`TRT_INTERLEAVED_ROPE_REASON`; ``--rope plugin`` takes them);
  an in-place block's ``TensorScatter`` writes become TensorRT's KV-cache update layers.

Every target: single-index ``GatherND`` table lookups (the score-bias tables) become ``Gather`` along axis 0
(:func:`posenc.graphs.gather.gathernd_to_gather`), the same lookup at a lower cost on ONNX Runtime CPU; on
``ort-cpu`` the q, k and v products of one input become one ``MatMul`` and a ``Split``
(:func:`posenc.graphs.projections.fuse_projections`).

On ``ort-cpu`` the position guard of rotary blocks is carried by ``RotaryEmbedding``'s own range check
(:func:`posenc.graphs.guard.guard_in_rotary`): a bad position still raises, ten nodes fewer per step.

In-place blocks (``--kv-cache inplace``) on ``ort-cpu`` also get :func:`posenc.graphs.cache_decode.decode_over_cache`:
decode steps attend over the cache buffers without copying them.

RoPE handling (``rope``): ``fused`` (standard op), ``plugin`` (posenc's TensorRT plugin node, see
:mod:`posenc.graphs.rope_plugin`), ``keep`` (leave the decomposed rotation alone).

The before/after parity check is the caller's :data:`ParityCheck` (``posenc optimize`` passes
:func:`posenc.validate.check_ort_parity`): this layer sits below ``posenc.validate`` and does not import it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx_ir as ir

from posenc.artifacts.files import atomic_outputs, json_text
from posenc.artifacts.paths import output_path
from posenc.dtypes import dtype_name
from posenc.errors import ConfigError, ModelFileError
from posenc.export.eager import check_graph_tables
from posenc.export.external import link_existing
from posenc.export.manifest import Manifest, OptimizedRecord, OutputDrift, PassRecord
from posenc.export.screen import unknown_ops
from posenc.graphs import (
    attention,
    cache,
    cache_decode,
    fold,
    gather,
    guard,
    model_io,
    prefill,
    projected_tables,
    projections,
    rope,
    rope_contrib,
    rope_layouts,
)
from posenc.graphs import match_utils as mu
from posenc.graphs.cache import RING_ON_TENSORRT, CacheFacts, attention_refusal, gqa_refusal
from posenc.graphs.choices import DEFAULT_FOLD_LIMIT, ROPE_MODES, TARGETS
from posenc.graphs.manifests import GraphManifest, ModelInfo, optimized_manifest, read_model_info
from posenc.records import to_json

MIN_FUSION_OPSET = 23

TRT_INTERLEAVED_ROPE_REASON = (
    "interleaved rotation (GPT-J pairs, Llama 4's complex-form RoPE): tensorrt_rtx 1.7.1 fails to build "
    "attention blocks holding an interleaved RotaryEmbedding (Myelin: MyelinCheckException in ssa.cpp), so for "
    "TensorRT it stays decomposed; `--rope plugin` fuses it into posenc's plugin"
)
"""Why ``--target trt`` leaves interleaved rotations decomposed. Seen with the Llama 4 RoPE layer, GPT-J and
``rope`` blocks with ``layout=interleaved`` (full or partial, grouped or not, fp32 and fp16, both table modes), with
``Attention`` fused or not; the same blocks build with the rotation decomposed, and a lone interleaved op builds."""


ParityCheck = Callable[[bytes, bytes, ModelInfo], dict[str, OutputDrift]]
"""``check(before, after, info) -> {output: OutputDrift}``: runs the serialized models
before and after optimization and raises :class:`~posenc.errors.ParityError` when an output moved.
posenc's is :func:`posenc.validate.check_ort_parity` (ONNX Runtime CPU; the graph layer does not import
``posenc.validate``, so callers pass it in)."""


@dataclasses.dataclass
class OptimizeResult:
    """What :func:`optimize_model` / :func:`optimize_file` did.

    Attributes:
        model: the rewritten IR model.
        target: ``ort-cpu``, ``ort-cuda`` or ``trt``.
        rope: ``fused``, ``plugin`` or ``keep``.
        passes: every pass in order with its match count.
        parity: ``{output: OutputDrift}`` of the check before/after, when run.
        path: the written ONNX file (``optimize_file``).
        manifest_path: the manifest written beside it.
        written: the ``optimized`` record written into that manifest (``optimize_file``).
    """

    model: ir.Model
    target: str
    rope: str
    passes: list[PassRecord]
    parity: dict[str, OutputDrift] | None = None
    path: Path | None = None
    manifest_path: Path | None = None
    written: OptimizedRecord | None = None

    @property
    def counts(self) -> dict[str, int]:
        return {p.name: p.count for p in self.passes}

    def record(self) -> OptimizedRecord:
        """The run as a manifest record (with its source file once :func:`optimize_file` wrote it)."""
        if self.written is not None:
            return self.written
        rules = cache.shape_rules(self.model)
        return OptimizedRecord(self.target, self.rope, tuple(self.passes), self.parity, "", None, shape_rules=rules)

    def to_dict(self) -> dict[str, Any]:
        return to_json(self.record())


def check_target(target: str) -> str:
    if target not in TARGETS:
        raise ConfigError(f"unknown optimization target {target!r}; use one of {list(TARGETS)}.")
    return target


def check_rope_mode(mode: str) -> str:
    if mode not in ROPE_MODES:
        raise ConfigError(f"unknown --rope mode {mode!r}; use one of {list(ROPE_MODES)}.")
    return mode


def _plugin_pass(model: ir.Model, declined: list[str]) -> int:
    try:
        from posenc.graphs.rope_plugin import rope_to_plugin
    except ImportError as exc:
        raise ConfigError(
            f"--rope plugin needs posenc.graphs.rope_plugin, which could not be imported ({exc}); "
            f"use --rope fused, or install posenc with its plugin support."
        ) from None
    return int(rope_to_plugin(model, fuse_decomposed=False, declined=declined))


def _attends(model: ir.Model) -> bool:
    """Whether the graph computes attention (a block, not a lone positional op)."""
    return any(node.op_type in ("Softmax", "Attention") for node in model.graph.all_nodes())


Pass = Callable[[ir.Model, list[str]], int]
"""``run(model, declined) -> matches rewritten``; ``declined`` collects why matches were left decomposed."""
Plan = list[tuple[str, Pass, bool, str]]
"""``(name, pass, needs opset 23, why it cannot run here or "")`` in order."""


def _pass_plan(target: str, rope_mode: str, facts: CacheFacts | None = None) -> Plan:
    """The passes of ``target`` (``facts``: what the manifest says about the block's cache and mask)."""
    plan: Plan = [
        ("convert_contrib_rope", lambda m, _: rope_contrib.convert_contrib_rope(m), True, ""),
        ("gathernd_to_gather", lambda m, _: gather.gathernd_to_gather(m), False, ""),
        ("project_tables", lambda m, _: projected_tables.project_tables(m), False, ""),
    ]
    if rope_mode in ("fused", "plugin"):

        def fuse_rope(model: ir.Model, declined: list[str]) -> int:
            refuse = (target, rope_mode) == ("trt", "fused") and _attends(model)
            refusal = TRT_INTERLEAVED_ROPE_REASON if refuse else None
            return rope.fuse_rope(model, interleaved_refusal=refusal, declined=declined)

        plan += [
            ("fuse_rope", fuse_rope, True, ""),
            ("fuse_partial_rope", lambda m, _: rope.fuse_partial_rope(m), True, ""),
        ]
    ort = target != "trt"  # TensorRT's parser rejects softmax_precision and softcap, its layer one head dim for v

    def fuse_attention(model: ir.Model, declined: list[str]) -> int:
        return attention.fuse_attention(model, ort, ort, equal_head_dims=not ort, declined=declined)

    plan.append(("fuse_attention", fuse_attention, True, ""))
    in_place = facts is not None and facts.in_place
    if in_place and target == "ort-cpu":
        why = attention_refusal(facts) or ""
        plan.append(("decode_over_cache", lambda m, _: cache_decode.decode_over_cache(m), True, why))
    if in_place and target == "ort-cuda":
        plan.append(("gqa_over_cache", cache.gqa_over_cache, True, gqa_refusal(facts) or ""))
    if rope_mode == "fused" and target == "ort-cpu":
        plan.append(("rope_to_3d", lambda m, _: rope_layouts.rope_to_3d(m), True, ""))
        plan.append(("guard_in_rotary", lambda m, _: guard.guard_in_rotary(m), True, ""))
    if target == "ort-cpu" and not in_place:
        plan.append(("prefill_over_gqa", prefill.prefill_over_gqa, True, prefill.prefill_refusal(facts) or ""))
    if target == "ort-cpu":
        plan.append(("fuse_projections", lambda m, _: projections.fuse_projections(m), False, ""))
    if rope_mode == "fused" and target == "trt":
        plan.append(("rope_for_tensorrt", lambda m, _: rope_layouts.rope_for_tensorrt(m), True, ""))
    if target == "trt":
        plan.append(("fold_causal_into_mask", lambda m, _: attention.fold_causal_into_mask(m), True, ""))
    if rope_mode == "plugin":
        plan.append(("rope_plugin", _plugin_pass, True, ""))
    return plan


def optimize_model(
    model: ir.Model,
    target: str,
    rope_mode: str = "fused",
    fold_limit: int = DEFAULT_FOLD_LIMIT,
    facts: CacheFacts | None = None,
) -> OptimizeResult:
    """Run the passes for ``target`` on ``model`` (in place).

    Args:
        model: the IR model (see :func:`posenc.graphs.model_io.load_model`).
        target: ``ort-cpu``, ``ort-cuda`` or ``trt``.
        rope_mode: ``fused``, ``plugin`` or ``keep``.
        fold_limit: largest constant (elements) constant folding may read or create.
        facts: what the manifest says about the block's cache and mask (:meth:`CacheFacts.of`); the passes of
            the in-place cache run only with it.

    Returns:
        :class:`OptimizeResult` with every pass and its match count. Fusions need opset 23 (the
        standard ``RotaryEmbedding`` and ``Attention`` ops); on older opsets they are listed as skipped.
    """
    check_target(target)
    check_rope_mode(rope_mode)
    if target == "trt" and facts is not None and facts.ring:
        raise ConfigError(RING_ON_TENSORRT + ".")
    fold.infer_shapes(model)
    records = [PassRecord("fold_constants", fold.fold_constants(model, fold_limit))]
    opset = model_io.default_opset(model)
    for name, run, needs_opset, refusal in _pass_plan(target, rope_mode, facts):
        if needs_opset and opset < MIN_FUSION_OPSET:
            records.append(PassRecord(name, 0, f"opset {opset} < {MIN_FUSION_OPSET}: re-export with opset 23 to fuse"))
            continue
        if refusal:
            records.append(PassRecord(name, 0, refusal))
            continue
        declined: list[str] = []
        records.append(PassRecord(name, int(run(model, declined)), declined=tuple(declined)))
        fold.infer_shapes(model)
    records.append(PassRecord("cleanup", fold.cleanup(model)))
    return OptimizeResult(model=model, target=target, rope=rope_mode, passes=records)


# --------------------------------------------------------------------------------------------------
# Files: load, optimize, check parity with the caller's check, write model + manifest atomically
# --------------------------------------------------------------------------------------------------


def optimize_file(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    target: str,
    rope_mode: str = "fused",
    *,
    check: ParityCheck | None = None,
    fold_limit: int = DEFAULT_FOLD_LIMIT,
) -> OptimizeResult:
    """Optimize an ONNX file for ``target`` and write it with its manifest (and weights) beside it.

    The manifest of ``source`` (from ``posenc export``) is carried over with the new hash and an
    ``optimized`` record (target, rope mode, each pass and its match count, parity before/after).

    Args:
        check: the before/after parity check (e.g. :func:`posenc.validate.check_ort_parity`, which
            ``posenc optimize`` uses unless ``--no-parity``); run when the optimized graph has only
            ONNX Runtime domains. ``None``: no check (``result.parity`` stays ``None``).

    Raises:
        ModelFileError: ``source`` is missing, not ONNX or beyond posenc's bounds (node count, unbounded loops:
            :mod:`posenc.export.screen`); ``output`` equals ``source``; with ``check``, ``source`` holds ops
            ONNX Runtime does not run (the check could not run: refused rather than skipped).
        ParityError: raised by ``check`` (e.g. the optimized graph's outputs differ from the original's on
            ONNX Runtime CPU by more than the scheme's tolerance); nothing is written then.
    """
    source, output = Path(source), output_path(output, "optimized model")
    if source.resolve() == output.resolve():
        raise ModelFileError(f"output {output} is the input file; write the optimized model to a new path.")
    if isinstance(fold_limit, bool) or not isinstance(fold_limit, int) or fold_limit < 0:
        raise ConfigError(f"fold_limit must be an int >= 0 (elements), got {fold_limit!r}.")
    info = read_model_info(source)
    weights = info.weights()  # safe-path rule and sha256, before anything is read or copied
    if info.manifest is not None and info.manifest.optimized is None:
        check_graph_tables(info.manifest, source)  # an edited manifest must not travel on with the new graph
    model = model_io.load_model(source)
    original_proto = model_io.model_to_proto(model)
    if check is not None:
        _check_runnable(original_proto, source)
    original = original_proto.SerializeToString()
    result = optimize_model(model, target, rope_mode, fold_limit, CacheFacts.of(info.manifest))
    if check is not None and _runs_on_ort(result.model):
        result.parity = check(original, model_io.model_to_proto(result.model).SerializeToString(), info)
    # Beside its source, the graph keeps reading the source's weights file (its external data, and the eager
    # rebuild's state): nothing is copied. Elsewhere, the file is copied and the graph points into the copy.
    same_folder = output.parent.resolve() == source.parent.resolve()
    new_weights = None if weights is None or same_folder else info.weights_path_for(output)
    optimized = model_io.model_to_proto(result.model, keep_external=same_folder)
    manifest_path = info.manifest_path_for(output)
    # Model, manifest and weights land together (the model last), or none of them does.
    with atomic_outputs(output, manifest_path, *([new_weights] if new_weights is not None else [])) as temps:
        if new_weights is not None and weights is not None:
            shutil.copyfile(weights, temps[2])
            link_existing(optimized, temps[2], new_weights.name)
        data = optimized.SerializeToString()
        written = optimized_manifest(info, hashlib.sha256(data).hexdigest(), result.record(), new_weights)
        written = _rotation_tables_as_stored(written, result.model)
        temps[0].write_bytes(data)
        temps[1].write_text(json_text(written.to_dict()))
    result.path, result.manifest_path, result.written = output, manifest_path, written.optimized
    return result


def _rotation_tables_as_stored(manifest: Manifest | GraphManifest, model: ir.Model) -> Manifest | GraphManifest:
    """The manifest with the ``table_dtype`` the optimized graph's rotations read their tables in, where the passes
    changed it (``rope_for_tensorrt``: TensorRT's ``RotaryEmbedding`` takes cos/sin in the activation dtype, so a
    bf16 block's float32 tables become bf16), and a note saying so; else unchanged."""
    if not isinstance(manifest, Manifest):
        return manifest
    read = {
        mu.dtype(table)
        for node in model.graph.all_nodes()
        if node.op_type == "RotaryEmbedding" and node.domain in ("", "ai.onnx")
        for table in node.inputs[1:3]
        if table is not None
    }
    names = sorted(dtype_name(str(dtype.numpy())) for dtype in read if dtype is not None)
    changed = [name for name in names if name != manifest.table_dtype]
    if not changed:
        return manifest
    note = (
        f"position tables: the optimized graph's RotaryEmbedding reads cos/sin in {', '.join(names)} (TensorRT's "
        f"rotary layer takes them in the activation dtype), not the export's {manifest.table_dtype}"
    )
    return dataclasses.replace(manifest, table_dtype=changed[0], notes=(*manifest.notes, note))


def _check_runnable(proto: Any, source: Path) -> None:
    """Refuse, before any pass, a graph the parity check cannot run: ops ONNX Runtime does not know.

    Raises:
        ModelFileError: names the ops and the way to optimize without the check.
    """
    unknown = unknown_ops(proto)
    if unknown:
        raise ModelFileError(
            f"{source} has ops ONNX Runtime does not run ({', '.join(unknown[:5])}), so posenc cannot check the "
            f"optimized graph's parity against it; remove the ops, or pass --no-parity to optimize without the "
            f"check (the result is then unchecked, and its manifest records no parity)."
        )


def _runs_on_ort(model: ir.Model) -> bool:
    """False when a node is in a domain ONNX Runtime cannot run without extra registration."""
    known = {"", "ai.onnx", "com.microsoft"} | {f.domain for f in model.functions.values()}
    return all(node.domain in known for node in model.graph)
