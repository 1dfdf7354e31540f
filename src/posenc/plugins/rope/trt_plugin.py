"""The TensorRT plugins of the RoPE kernel, defined with ``tensorrt.plugin`` (quickly deployable plugins).

:func:`register_rope_plugins` registers four plugins in namespace ``posenc`` (``PosencRope``,
``PosencRopeCache``, ``PosencRopeFreq``, ``PosencRopeNtk``; see :mod:`.spec`). Each has:

- ``register``: outputs ``(q_out, k_out)`` shaped and typed like ``(q, k)``;
- ``autotune``: LINEAR formats; q/k/outputs FP32|FP16|BF16 together; cos/sin FP32, FP16 or BF16 independently
  of q; positions INT64 or INT32; tactics = :data:`.spec.TACTICS` (heads per program, warps);
- ``aot_impl``: PTX compiled by ``triton.compile`` for the engine's GPU (:func:`target_arch`), with symbolic
  launch arguments, so the engine runs in any TensorRT runtime (trtexec, C++) without Python;
- ``impl``: a Python (JIT) implementation that launches the same kernel through torch, for debugging.

Requires datacenter TensorRT >= 10.9 (ahead-of-time QDPs) on a machine with an NVIDIA GPU to build engines.
TensorRT-RTX has no plugins.

This module deliberately has no ``from __future__ import annotations``: ``tensorrt.plugin`` inspects the
annotations of the decorated functions as classes.
"""

import os
from typing import Any

from posenc.errors import BackendUnavailable, BuildError
from posenc.plugins.rope.aot import compile_rope_ptx, contiguous_scalar_args, launch_grid, spec_for_build
from posenc.plugins.rope.spec import PLUGIN_NAMESPACE, TACTICS, AngleSource, RopeKernelSpec

__all__ = ["plugin_ids", "register_rope_plugins", "target_arch"]

_REGISTERED: list[str] = []
_DEFAULT_TACTIC = 3


def _import_tensorrt() -> tuple[Any, Any]:
    try:
        import tensorrt as trt
        import tensorrt.plugin as trtp
    except ImportError as exc:
        raise BackendUnavailable(
            f"the posenc RoPE TensorRT plugin needs datacenter TensorRT with tensorrt.plugin ({exc}); install it "
            f"with `pip install 'posenc[trt]'` on a machine with an NVIDIA GPU. TensorRT-RTX has no plugins."
        ) from exc
    if not hasattr(trt, "QuickPluginCreationRequest"):
        raise BackendUnavailable(
            f"TensorRT {getattr(trt, '__version__', '?')} has no ahead-of-time Python plugins; "
            f"install TensorRT >= 10.9 (`pip install 'posenc[trt]'`)."
        )
    return trt, trtp


def plugin_ids() -> list[str]:
    """``namespace::name`` of the four plugins."""
    return [f"{PLUGIN_NAMESPACE}::{source.plugin_name}" for source in AngleSource]


def target_arch() -> int:
    """Compute capability the AOT PTX is compiled for: ``$POSENC_ROPE_SM`` (e.g. ``90``), else the current GPU.

    Raises:
        BuildError: no GPU visible and ``POSENC_ROPE_SM`` unset.
    """
    env = os.environ.get("POSENC_ROPE_SM")
    if env:
        try:
            return int(env.replace("sm_", "").replace(".", ""))
        except ValueError:
            raise BuildError(f"POSENC_ROPE_SM must look like 90 or sm_90, got {env!r}.") from None
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return major * 10 + minor
    except ImportError:
        pass
    raise BuildError("no CUDA device visible to choose the plugin's PTX target; set POSENC_ROPE_SM (e.g. 90).")


def _dtype_name(trt: Any, dtype: Any) -> str:
    names = {
        trt.float32: "float32",
        trt.float16: "float16",
        trt.bfloat16: "bfloat16",
        trt.int64: "int64",
        trt.int32: "int32",
    }
    if dtype not in names:
        raise BuildError(f"the posenc RoPE plugin does not support tensors of type {dtype}; use FP32, FP16 or BF16.")
    return names[dtype]


def _static_head_dim(x: Any) -> int:
    dim = x.shape_expr[-1]
    if getattr(dim, "is_fake", False) or not dim.is_constant:
        raise BuildError(
            "the posenc RoPE plugin needs static head dims (last axis of q and k); make them static in the graph."
        )
    return int(dim.constant_value())


def _aot(source: AngleSource, inputs: dict[str, Any], attrs: dict[str, Any], tactic: int) -> tuple[Any, ...]:
    """Compile and describe one launch: ``(kernel name, PTX, KernelLaunchParams, SymIntExprs)``."""
    trt, trtp = _import_tensorrt()
    q, k = inputs["q"], inputs["k"]
    if len(q.shape_expr) != 4 or len(k.shape_expr) != 4:
        raise BuildError("the posenc RoPE plugin takes 4-D q and k ([B, H, S, D] or [B, S, H, D]).")
    spec, fmt = spec_for_build(source, attrs, _static_head_dim(q), _static_head_dim(k))
    block_h, num_warps = TACTICS.get(int(tactic), TACTICS[_DEFAULT_TACTIC])
    table = inputs.get("cos_table", inputs.get("cos"))
    positions = inputs.get("positions")
    compiled = compile_rope_ptx(
        spec,
        arch=target_arch(),
        qk_dtype=_dtype_name(trt, q.dtype),
        table_dtype=_dtype_name(trt, table.dtype) if table is not None else None,
        positions_dtype=_dtype_name(trt, positions.dtype) if positions is not None else "int64",
        block_h=block_h,
        num_warps=num_warps,
    )
    scalars = contiguous_scalar_args(
        spec,
        fmt,
        list(q.shape_expr),
        list(k.shape_expr),
        list(table.shape_expr) if table is not None else None,
        list(positions.shape_expr) if positions is not None else None,
    )
    grid_x, grid_y = launch_grid(fmt, list(q.shape_expr), list(k.shape_expr), block_h)
    launch = trtp.KernelLaunchParams()
    launch.grid_x = grid_x
    launch.grid_y = grid_y
    launch.block_x = compiled.num_warps * 32
    launch.shared_mem = compiled.shared
    extra = trtp.SymIntExprs.from_tuple([trtp.SymInt32(value) for value in scalars])
    return compiled.name.encode(), compiled.ptx.encode(), launch, extra


def _impl(source: AngleSource, tensors: dict[str, Any], attrs: dict[str, Any], outputs: Any, stream: int) -> None:
    """JIT (Python) implementation: launch the same kernel through torch on TensorRT's stream."""
    import torch

    from posenc.plugins.rope.launch import rope_qk

    with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        t = {name: torch.as_tensor(value, device="cuda") for name, value in tensors.items()}
        out = (torch.as_tensor(outputs[0], device="cuda"), torch.as_tensor(outputs[1], device="cuda"))
        spec, fmt = RopeKernelSpec.from_plugin_attributes(source, attrs, t["q"].shape[-1], t["k"].shape[-1])
        rope_qk(
            t["q"],
            t["k"],
            spec,
            cos=t.get("cos_table", t.get("cos")),
            sin=t.get("sin_table", t.get("sin")),
            turns=t.get("turns"),
            positions=t.get("positions"),
            qk_format=fmt,
            out=out,
        )


def _combinations(trtp: Any, source: AngleSource) -> list[Any]:
    """Type/format combinations: q, k and outputs share FP32|FP16|BF16; tables and positions vary on their own."""
    qk = "FP32|FP16|BF16"
    tables = ("FP32", "FP16", "BF16") if source in (AngleSource.TABLE, AngleSource.CACHE) else ("",)
    combos = []
    for table in tables:
        per_input = {"q": qk, "k": qk, "cos_table": table, "sin_table": table, "cos": table, "sin": table}
        per_input.update({"turns": "FP32", "positions": "INT64*INT32"})
        types = [per_input[name] for name in source.inputs] + [qk, qk]
        combos.append(trtp.AutoTuneCombination(", ".join(types), "LINEAR", list(TACTICS)))
    return combos


def register_rope_plugins() -> list[str]:
    """Register the four posenc RoPE plugins with TensorRT (idempotent). Returns their ids.

    Import and call this in the process that builds the engine (and, for the JIT ``impl`` only, in the process
    that runs it). Engines built with the AOT implementation run without Python and without this module.

    Raises:
        BackendUnavailable: tensorrt (>= 10.9, with ``tensorrt.plugin``) is not importable.
    """
    if _REGISTERED:
        return list(_REGISTERED)
    _, trtp = _import_tensorrt()
    _define_table(trtp)
    _define_cache(trtp)
    _define_freq(trtp)
    _define_ntk(trtp)
    _REGISTERED.extend(plugin_ids())
    return list(_REGISTERED)


def _define_table(trtp: Any) -> None:
    pid = f"{PLUGIN_NAMESPACE}::{AngleSource.TABLE.plugin_name}"
    desc, tensor = trtp.TensorDesc, trtp.Tensor
    aot_return = tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]

    @trtp.register(pid)
    def table_desc(
        q: desc,
        k: desc,
        cos_table: desc,
        sin_table: desc,
        positions: desc,
        interleaved: int,
        rotary_dim: int,
        qk_format: int,
        position_mode: int,
    ) -> tuple[desc, desc]:
        return q.like(), k.like()

    @trtp.autotune(pid)
    def table_autotune(
        q: desc, k: desc, cos_table: desc, sin_table: desc, positions: desc, outputs: tuple[desc, desc]
    ) -> list[trtp.AutoTuneCombination]:
        return _combinations(trtp, AngleSource.TABLE)

    @trtp.aot_impl(pid)
    def table_aot(
        q: desc,
        k: desc,
        cos_table: desc,
        sin_table: desc,
        positions: desc,
        interleaved: int,
        rotary_dim: int,
        qk_format: int,
        position_mode: int,
        outputs: tuple[desc, desc],
        tactic: int,
    ) -> aot_return:
        inputs = {"q": q, "k": k, "cos_table": cos_table, "sin_table": sin_table, "positions": positions}
        attrs = {"interleaved": interleaved, "rotary_dim": rotary_dim, "qk_format": qk_format}
        return _aot(AngleSource.TABLE, inputs, {**attrs, "position_mode": position_mode}, tactic)

    @trtp.impl(pid)
    def table_impl(
        q: tensor,
        k: tensor,
        cos_table: tensor,
        sin_table: tensor,
        positions: tensor,
        interleaved: int,
        rotary_dim: int,
        qk_format: int,
        position_mode: int,
        outputs: tuple[tensor, tensor],
        stream: int,
    ) -> None:
        tensors = {"q": q, "k": k, "cos_table": cos_table, "sin_table": sin_table, "positions": positions}
        attrs = {"interleaved": interleaved, "rotary_dim": rotary_dim, "qk_format": qk_format}
        _impl(AngleSource.TABLE, tensors, {**attrs, "position_mode": position_mode}, outputs, stream)


def _define_cache(trtp: Any) -> None:
    pid = f"{PLUGIN_NAMESPACE}::{AngleSource.CACHE.plugin_name}"
    desc, tensor = trtp.TensorDesc, trtp.Tensor
    aot_return = tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]

    @trtp.register(pid)
    def cache_desc(
        q: desc, k: desc, cos: desc, sin: desc, interleaved: int, rotary_dim: int, qk_format: int
    ) -> tuple[desc, desc]:
        return q.like(), k.like()

    @trtp.autotune(pid)
    def cache_autotune(
        q: desc, k: desc, cos: desc, sin: desc, outputs: tuple[desc, desc]
    ) -> list[trtp.AutoTuneCombination]:
        return _combinations(trtp, AngleSource.CACHE)

    @trtp.aot_impl(pid)
    def cache_aot(
        q: desc,
        k: desc,
        cos: desc,
        sin: desc,
        interleaved: int,
        rotary_dim: int,
        qk_format: int,
        outputs: tuple[desc, desc],
        tactic: int,
    ) -> aot_return:
        attrs = {"interleaved": interleaved, "rotary_dim": rotary_dim, "qk_format": qk_format}
        return _aot(AngleSource.CACHE, {"q": q, "k": k, "cos": cos, "sin": sin}, attrs, tactic)

    @trtp.impl(pid)
    def cache_impl(
        q: tensor,
        k: tensor,
        cos: tensor,
        sin: tensor,
        interleaved: int,
        rotary_dim: int,
        qk_format: int,
        outputs: tuple[tensor, tensor],
        stream: int,
    ) -> None:
        attrs = {"interleaved": interleaved, "rotary_dim": rotary_dim, "qk_format": qk_format}
        _impl(AngleSource.CACHE, {"q": q, "k": k, "cos": cos, "sin": sin}, attrs, outputs, stream)


def _define_freq(trtp: Any) -> None:
    pid = f"{PLUGIN_NAMESPACE}::{AngleSource.FREQ.plugin_name}"
    desc, tensor = trtp.TensorDesc, trtp.Tensor
    aot_return = tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]

    @trtp.register(pid)
    def freq_desc(
        q: desc,
        k: desc,
        turns: desc,
        positions: desc,
        interleaved: int,
        rotary_dim: int,
        qk_format: int,
        position_mode: int,
        attention_factor: float,
        longrope_original: int,
    ) -> tuple[desc, desc]:
        return q.like(), k.like()

    @trtp.autotune(pid)
    def freq_autotune(
        q: desc, k: desc, turns: desc, positions: desc, outputs: tuple[desc, desc]
    ) -> list[trtp.AutoTuneCombination]:
        return _combinations(trtp, AngleSource.FREQ)

    @trtp.aot_impl(pid)
    def freq_aot(
        q: desc,
        k: desc,
        turns: desc,
        positions: desc,
        interleaved: int,
        rotary_dim: int,
        qk_format: int,
        position_mode: int,
        attention_factor: float,
        longrope_original: int,
        outputs: tuple[desc, desc],
        tactic: int,
    ) -> aot_return:
        attrs = {
            "interleaved": interleaved,
            "rotary_dim": rotary_dim,
            "qk_format": qk_format,
            "position_mode": position_mode,
            "attention_factor": attention_factor,
            "longrope_original": longrope_original,
        }
        return _aot(AngleSource.FREQ, {"q": q, "k": k, "turns": turns, "positions": positions}, attrs, tactic)

    @trtp.impl(pid)
    def freq_impl(
        q: tensor,
        k: tensor,
        turns: tensor,
        positions: tensor,
        interleaved: int,
        rotary_dim: int,
        qk_format: int,
        position_mode: int,
        attention_factor: float,
        longrope_original: int,
        outputs: tuple[tensor, tensor],
        stream: int,
    ) -> None:
        attrs = {
            "interleaved": interleaved,
            "rotary_dim": rotary_dim,
            "qk_format": qk_format,
            "position_mode": position_mode,
            "attention_factor": attention_factor,
            "longrope_original": longrope_original,
        }
        _impl(AngleSource.FREQ, {"q": q, "k": k, "turns": turns, "positions": positions}, attrs, outputs, stream)


def _define_ntk(trtp: Any) -> None:
    pid = f"{PLUGIN_NAMESPACE}::{AngleSource.NTK.plugin_name}"
    desc, tensor = trtp.TensorDesc, trtp.Tensor
    aot_return = tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]

    @trtp.register(pid)
    def ntk_desc(
        q: desc,
        k: desc,
        positions: desc,
        interleaved: int,
        rotary_dim: int,
        qk_format: int,
        position_mode: int,
        rope_theta: float,
        factor: float,
        max_position_embeddings: int,
    ) -> tuple[desc, desc]:
        return q.like(), k.like()

    @trtp.autotune(pid)
    def ntk_autotune(q: desc, k: desc, positions: desc, outputs: tuple[desc, desc]) -> list[trtp.AutoTuneCombination]:
        return _combinations(trtp, AngleSource.NTK)

    @trtp.aot_impl(pid)
    def ntk_aot(
        q: desc,
        k: desc,
        positions: desc,
        interleaved: int,
        rotary_dim: int,
        qk_format: int,
        position_mode: int,
        rope_theta: float,
        factor: float,
        max_position_embeddings: int,
        outputs: tuple[desc, desc],
        tactic: int,
    ) -> aot_return:
        attrs = {
            "interleaved": interleaved,
            "rotary_dim": rotary_dim,
            "qk_format": qk_format,
            "position_mode": position_mode,
            "rope_theta": rope_theta,
            "factor": factor,
            "max_position_embeddings": max_position_embeddings,
        }
        return _aot(AngleSource.NTK, {"q": q, "k": k, "positions": positions}, attrs, tactic)

    @trtp.impl(pid)
    def ntk_impl(
        q: tensor,
        k: tensor,
        positions: tensor,
        interleaved: int,
        rotary_dim: int,
        qk_format: int,
        position_mode: int,
        rope_theta: float,
        factor: float,
        max_position_embeddings: int,
        outputs: tuple[tensor, tensor],
        stream: int,
    ) -> None:
        attrs = {
            "interleaved": interleaved,
            "rotary_dim": rotary_dim,
            "qk_format": qk_format,
            "position_mode": position_mode,
            "rope_theta": rope_theta,
            "factor": factor,
            "max_position_embeddings": max_position_embeddings,
        }
        _impl(AngleSource.NTK, {"q": q, "k": k, "positions": positions}, attrs, outputs, stream)
