"""Compile the RoPE kernel to PTX for a GPU architecture, without a GPU (``triton.compile`` + ``GPUTarget``).

The TensorRT ahead-of-time plugin launches the PTX entry with exactly: tensor inputs, int32 scalars, tensor
outputs. Triton >= 3.3 appends two pointer parameters to every entry (``global_scratch`` and
``profile_scratch``) that TensorRT does not pass. :func:`compile_rope_ptx` checks that the kernel uses neither
(no scratch memory requested, parameters never loaded), removes them from the ``.entry`` declaration and
verifies that the parameter list then matches the plugin contract, so the launch is well-defined.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Any

from posenc.errors import BackendUnavailable, BuildError, ConfigError
from posenc.plugins.rope.spec import (
    ACTIVATION_DTYPES,
    TABLE_DTYPES,
    AngleSource,
    PositionMode,
    QKFormat,
    RopeKernelSpec,
    check_dtype,
    parse_qk_format,
)

__all__ = [
    "NUM_SCALAR_ARGS",
    "CompiledRope",
    "assemble_ptx",
    "compile_rope_ptx",
    "contiguous_scalar_args",
    "expected_param_count",
    "kernel_signature",
    "launch_grid",
    "load_kernel",
    "ptx_entry_params",
    "spec_for_build",
]

NUM_SCALAR_ARGS = 20
"""int32 scalars between the tensor inputs and outputs: S, Hq, Hkv, position rows, 12 q/k/q_out/k_out strides,
2 cos/sin strides, 2 position strides (see ``kernel.rope_qk_kernel``)."""


def load_kernel() -> Any:
    """Import the Triton kernel module, or raise :class:`BackendUnavailable` with the install command."""
    try:
        from posenc.plugins.rope import kernel
    except ImportError as exc:
        raise BackendUnavailable(
            f"the posenc RoPE kernel needs triton ({exc}); install it with `pip install 'posenc[triton]'` "
            f"(or `pip install triton`)."
        ) from exc
    return kernel


_TRITON_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int64": "i64", "int32": "i32"}
_SCALAR_NAMES = (
    "S",
    "HQ",
    "HKV",
    "POS_ROWS",
    "sq_b",
    "sq_h",
    "sq_s",
    "sk_b",
    "sk_h",
    "sk_s",
    "soq_b",
    "soq_h",
    "soq_s",
    "sok_b",
    "sok_h",
    "sok_s",
    "sc_0",
    "sc_1",
    "sp_b",
    "sp_s",
)
_QK_STRIDES = _SCALAR_NAMES[4:16]
_ENTRY = re.compile(r"\.entry\s+(?P<name>[\w$]+)\s*\((?P<params>[^)]*)\)", re.S)


@dataclasses.dataclass(frozen=True)
class CompiledRope:
    """A compiled kernel: what the TensorRT AOT implementation returns, plus what produced it."""

    name: str
    ptx: str
    arch: int
    num_warps: int
    shared: int
    block_h: int
    params: tuple[str, ...]
    """The ``.entry`` parameter declarations after removing Triton's unused scratch pointers."""
    removed_scratch_params: int


def spec_for_build(
    source: AngleSource | str, attrs: dict[str, Any], head_dim: int, key_head_dim: int | None = None
) -> tuple[RopeKernelSpec, QKFormat]:
    """The kernel spec of a plugin node at engine build time; bad attributes raise :class:`BuildError`."""
    try:
        return RopeKernelSpec.from_plugin_attributes(source, attrs, head_dim, key_head_dim)
    except ConfigError as exc:
        raise BuildError(f"cannot build the posenc RoPE plugin ({getattr(source, 'value', source)}): {exc}") from exc


def expected_param_count(spec: RopeKernelSpec) -> int:
    """Parameters TensorRT passes to the plugin's kernel: inputs + int32 scalars + 2 outputs."""
    return len(spec.angles.inputs) + NUM_SCALAR_ARGS + 2


def ptx_entry_params(ptx: str) -> tuple[str, list[str]]:
    """``(entry name, parameter declarations)`` of the (single) ``.entry`` in a PTX module."""
    match = _ENTRY.search(ptx)
    if match is None:
        raise BuildError("the compiled PTX has no .entry; the Triton compilation produced no kernel.")
    params = [p.strip().rstrip(",").strip() for p in match.group("params").split("\n") if p.strip()]
    return match.group("name"), params


def _param_name(decl: str) -> str:
    return decl.split()[-1]


def _strip_unused_trailing_params(ptx: str, expected: int) -> tuple[str, int]:
    name, params = ptx_entry_params(ptx)
    extra = len(params) - expected
    if extra == 0:
        return ptx, 0
    if extra < 0 or extra > 2:
        raise BuildError(
            f"kernel {name} has {len(params)} PTX parameters, expected {expected} (+ up to 2 Triton scratch "
            f"pointers); the TensorRT launch would not match. Pin triton to a tested version (3.3-3.9)."
        )
    removed = params[expected:]
    match = _ENTRY.search(ptx)
    assert match is not None  # checked by ptx_entry_params
    body = ptx[match.end() :]
    for decl in removed:
        if ".u64" not in decl or re.search(rf"\b{re.escape(_param_name(decl))}\b", body):
            raise BuildError(
                f"kernel {name} uses its trailing parameter {_param_name(decl)!r} (Triton scratch memory); "
                f"TensorRT's AOT launch does not pass it. Reduce the block size so that no scratch is needed."
            )
    kept = ",\n\t".join(params[:expected])
    new_entry = f".entry {name}(\n\t{kept}\n)"
    return ptx[: match.start()] + new_entry + ptx[match.end() :], extra


def _check_dtypes(spec: RopeKernelSpec, qk_dtype: str, table_dtype: str | None, positions_dtype: str) -> None:
    check_dtype(qk_dtype, ACTIVATION_DTYPES, "q/k")
    if spec.angles in (AngleSource.TABLE, AngleSource.CACHE):
        check_dtype(table_dtype or "", TABLE_DTYPES, "cos/sin")
    if spec.angles.uses_positions and positions_dtype not in ("int64", "int32"):
        raise ConfigError(f"positions must be int64 (or int32), got {positions_dtype}.")


def kernel_signature(
    spec: RopeKernelSpec,
    *,
    qk_dtype: str,
    table_dtype: str | None = None,
    positions_dtype: str = "int64",
    aligned: bool = True,
) -> tuple[dict[str, str], dict[str, Any], dict[tuple[int, ...], list[list[Any]]]]:
    """Triton ``(signature, constexpr pointer args, divisibility attrs)`` for one plugin instance.

    ``aligned`` declares pointers 16-byte aligned and, when the head dim (table width) is a multiple of 16, the
    q/k (cos/sin) strides multiples of 16 elements: true for TensorRT's contiguous plugin I/O, and what lets
    Triton emit 16-byte vector loads.
    """
    kernel = load_kernel().rope_qk_kernel
    _check_dtypes(spec, qk_dtype, table_dtype, positions_dtype)
    qk = _TRITON_TYPES[qk_dtype]
    pointers: dict[str, str | None] = {
        "q_ptr": f"*{qk}",
        "k_ptr": f"*{qk}",
        "cos_ptr": None,
        "sin_ptr": None,
        "pos_ptr": f"*{_TRITON_TYPES[positions_dtype]}" if spec.angles.uses_positions else None,
        "qo_ptr": f"*{qk}",
        "ko_ptr": f"*{qk}",
    }
    if spec.angles in (AngleSource.TABLE, AngleSource.CACHE):
        pointers["cos_ptr"] = pointers["sin_ptr"] = f"*{_TRITON_TYPES[table_dtype or 'float32']}"
    elif spec.angles is AngleSource.FREQ:
        pointers["cos_ptr"] = "*fp32"
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    for arg in kernel.arg_names:
        if arg in pointers:
            if pointers[arg] is None:
                signature[arg] = "constexpr"
                constexprs[arg] = None
            else:
                signature[arg] = pointers[arg]  # type: ignore[assignment]  # triton's signature maps names to type strings
        elif arg in _SCALAR_NAMES:
            signature[arg] = "i32"
        else:
            signature[arg] = "constexpr"
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    if aligned:
        divisible = [a for a, t in pointers.items() if t is not None]
        if spec.head_dim % 16 == 0 and spec.key_head_dim == spec.head_dim:
            divisible += list(_QK_STRIDES)
        if spec.angles in (AngleSource.TABLE, AngleSource.CACHE) and spec.half % 16 == 0:
            divisible += ["sc_0", "sc_1"] if spec.angles is AngleSource.CACHE else ["sc_0"]
        attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in divisible}
    return signature, constexprs, attrs


def compile_rope_ptx(
    spec: RopeKernelSpec,
    *,
    arch: int,
    qk_dtype: str,
    table_dtype: str | None = None,
    positions_dtype: str = "int64",
    block_h: int = 8,
    num_warps: int = 4,
    ptx_version: int | None = None,
    aligned: bool = True,
) -> CompiledRope:
    """Compile the kernel for one plugin instance to PTX for ``sm_<arch>`` (no GPU needed).

    Args:
        spec: kernel configuration.
        arch: compute capability as an int (80 = A100, 89 = L4/L40, 90 = H100/H200).
        qk_dtype, table_dtype, positions_dtype: dtype names of q/k, cos/sin (TABLE/CACHE) and positions.
        block_h, num_warps: heads per program and warps (the plugin's tactic).
        ptx_version: PTX ISA version as an int (80 = 8.0); default ``$POSENC_ROPE_PTX_VERSION`` or 80, which
            CUDA 12.0+ drivers load. Triton's own default follows its bundled ptxas and may be newer than the
            driver that runs the engine.
        aligned: see :func:`kernel_signature`.

    Raises:
        BuildError: unsupported dtype, layout or rotary_dim (with the reason), a failed compilation, or a
            parameter list that does not match what TensorRT passes.
        BackendUnavailable: triton is not installed.
    """
    try:
        _check_dtypes(spec, qk_dtype, table_dtype, positions_dtype)
        constants = spec.constexprs(block_h)
    except ConfigError as exc:
        raise BuildError(f"cannot build the {spec.plugin_name} kernel: {exc}") from exc
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise BuildError(
            "TRITON_INTERPRET=1 is set: triton's interpreter cannot compile PTX. Compile in a process started "
            "without it (the kernel tests set it; the engine build must not)."
        )
    signature, constexprs, attrs = kernel_signature(
        spec, qk_dtype=qk_dtype, table_dtype=table_dtype, positions_dtype=positions_dtype, aligned=aligned
    )
    constexprs.update(constants)
    import triton
    from triton.backends.compiler import GPUTarget

    kernel = load_kernel().rope_qk_kernel
    version = ptx_version or int(os.environ.get("POSENC_ROPE_PTX_VERSION", "80"))
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "ptx_version": version, "enable_fp_fusion": True}
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", int(arch), 32), options=options)
    except Exception as exc:  # triton raises many types (CompilationError, RuntimeError from ptxas, ...)
        raise BuildError(f"triton could not compile the {spec.plugin_name} kernel for sm_{arch}: {exc}") from exc
    for scratch in ("global_scratch_size", "profile_scratch_size"):
        if getattr(compiled.metadata, scratch, 0):
            raise BuildError(
                f"the {spec.plugin_name} kernel needs Triton {scratch.replace('_size', '')} memory, which "
                f"TensorRT's AOT launch does not provide; use a smaller block_h."
            )
    ptx, removed = _strip_unused_trailing_params(compiled.asm["ptx"], expected_param_count(spec))
    _, params = ptx_entry_params(ptx)
    return CompiledRope(
        name=compiled.metadata.name,
        ptx=ptx,
        arch=int(arch),
        num_warps=compiled.metadata.num_warps,
        shared=compiled.metadata.shared,
        block_h=block_h,
        params=tuple(params),
        removed_scratch_params=removed,
    )


def assemble_ptx(ptx: str, arch: int) -> bytes:
    """Assemble PTX to a cubin with Triton's bundled ptxas (a validity check that needs no GPU).

    Raises:
        BackendUnavailable: no ptxas found.
        BuildError: ptxas rejected the PTX (its message is included).
    """
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(int(arch)).path
    except Exception as exc:
        ptxas = shutil.which("ptxas")
        if ptxas is None:
            raise BackendUnavailable(f"no ptxas available to assemble PTX ({exc}); install triton.") from exc
    suffix = "a" if int(arch) >= 90 else ""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run(
            [ptxas, f"--gpu-name=sm_{arch}{suffix}", src, "-o", out], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise BuildError(f"ptxas rejected the PTX for sm_{arch}: {proc.stderr.strip()}")
        with open(out, "rb") as f:
            return f.read()


def _is_one(value: Any) -> bool:
    """True for the int 1 or a TensorRT shape expression known to be the constant 1."""
    if isinstance(value, int):
        return value == 1
    try:
        return (not getattr(value, "is_fake", False)) and bool(value.is_constant) and value.constant_value() == 1
    except (AttributeError, RuntimeError):
        return False


def contiguous_scalar_args(
    spec: RopeKernelSpec,
    qk_format: QKFormat | str,
    q_shape: Sequence[Any],
    k_shape: Sequence[Any],
    angle_shape: Sequence[Any] | None = None,
    positions_shape: Sequence[Any] | None = None,
) -> list[Any]:
    """The kernel's 20 int32 scalars for contiguous q, k, outputs, cos/sin and positions of these shapes.

    Works on ints and on TensorRT shape expressions alike (only ``+``, ``*`` are used), so the TensorRT plugin
    computes its launch arguments symbolically with the same code the CPU tests check against torch strides.
    """
    fmt = parse_qk_format(qk_format)
    Dk = k_shape[3]
    if fmt is QKFormat.BHSD:
        _, Hq, S, D = q_shape
        Hkv = k_shape[1]
        q_strides = [Hq * S * D, S * D, D]
        k_strides = [Hkv * S * Dk, S * Dk, Dk]
    else:
        _, S, Hq, D = q_shape
        Hkv = k_shape[2]
        q_strides = [S * Hq * D, D, Hq * D]
        k_strides = [S * Hkv * Dk, Dk, Hkv * Dk]
    half = spec.half
    sc: list[Any] = [0, 0]
    if spec.angles is AngleSource.TABLE:
        sc = [half, 0]
    elif spec.angles is AngleSource.CACHE:
        if angle_shape is None:
            raise BuildError("CACHE kernels need the cos/sin shape [B, S, r/2].")
        sc = [0 if _is_one(angle_shape[0]) else S * half, half]
    pos_rows: Any = 1
    sp: list[Any] = [0, 0]
    if spec.angles.uses_positions:
        if positions_shape is None:
            raise BuildError(f"{spec.plugin_name} needs the positions shape.")
        pos_rows = positions_shape[-2] if spec.axes > 1 else positions_shape[0]  # multi-axis: [A, rows, S]
        sp = [S, 1] if spec.positions is PositionMode.IDS else [1, 0]
    return [S, Hq, Hkv, pos_rows, *q_strides, *k_strides, *q_strides, *k_strides, *sc, *sp]


def launch_grid(qk_format: QKFormat | str, q_shape: Sequence[Any], k_shape: Sequence[Any], block_h: int) -> tuple:
    """``(B * S, cdiv(Hq, BLOCK_H) + cdiv(Hkv, BLOCK_H))`` on ints or TensorRT shape expressions."""
    fmt = parse_qk_format(qk_format)
    if fmt is QKFormat.BHSD:
        B, Hq, S = q_shape[0], q_shape[1], q_shape[2]
        Hkv = k_shape[1]
    else:
        B, S, Hq = q_shape[0], q_shape[1], q_shape[2]
        Hkv = k_shape[2]
    return B * S, (Hq + (block_h - 1)) // block_h + (Hkv + (block_h - 1)) // block_h
