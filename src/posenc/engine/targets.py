"""Compute-capability targets (``sm75`` ... ``sm120``) per backend.

TensorRT-RTX compiles ahead of time for the compute capabilities its ``ComputeCapability`` enum lists
(1.7: SM75, SM80, SM86, SM89, SM120, SM121; no Hopper or datacenter Blackwell). Datacenter TensorRT builds
for the GPU it runs on, so its only target is that GPU's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from posenc.engine.backend import Backend
from posenc.errors import ConfigError

_PATTERN = re.compile(r"^(?:sm_?)?(\d+)(?:\.(\d))?$", re.IGNORECASE)


def normalize_target(text: str) -> str:
    """``"sm89"``, ``"SM_89"``, ``"8.9"``, ``"89"`` -> ``"sm89"``.

    Raises:
        ConfigError: not a compute capability.
    """
    match = _PATTERN.match(text.strip())
    if not match:
        raise ConfigError(f"target {text!r} is not a compute capability; write it like sm89 (or 8.9).")
    major, minor = match.groups()
    return f"sm{major}{minor}" if minor is not None else f"sm{major}"


def capability_tuple(target: str) -> tuple[int, int]:
    """``"sm89"`` -> ``(8, 9)``; ``"sm120"`` -> ``(12, 0)``."""
    digits = normalize_target(target)[2:]
    return int(digits[:-1]), int(digits[-1])


def supported_targets(backend: Backend) -> list[str]:
    """Targets ``backend`` can build for on this machine."""
    if backend.is_rtx:
        names = [n for n in dir(backend.trt.ComputeCapability) if re.fullmatch(r"SM\d+", n)]
        return sorted((n.lower() for n in names), key=lambda t: capability_tuple(t))
    current = current_gpu_target()
    return [current] if current else []


def current_gpu_target() -> str | None:
    """The compute capability of GPU 0 (via torch), or ``None`` without a CUDA device."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(0)
    except Exception:  # no CUDA build of torch, no driver
        return None
    return f"sm{major}{minor}"


def resolve_targets(backend: Backend, requested: Sequence[str] | None) -> list[str]:
    """Validate requested targets against the backend (duplicates removed, order kept).

    ``None`` or empty: RTX builds for its default set (recorded as ``[]``); datacenter TensorRT for the
    current GPU.

    Raises:
        ConfigError: a target the backend cannot build for (the message lists the supported ones).
    """
    supported = supported_targets(backend)
    if not requested:
        return [] if backend.is_rtx else supported
    targets: list[str] = []
    for text in requested:
        target = normalize_target(text)
        if target not in supported:
            where = "" if backend.is_rtx else " (datacenter TensorRT builds for the GPU it runs on)"
            raise ConfigError(
                f"{backend.describe()} cannot build for {target}{where}; supported targets: "
                f"{', '.join(supported) or 'none on this machine'}. "
                + (
                    "Hopper (sm90) and datacenter Blackwell need datacenter TensorRT on such a GPU."
                    if backend.is_rtx
                    else "Use tensorrt_rtx to build ahead of time for other GPUs."
                )
            )
        if target not in targets:
            targets.append(target)
    return targets
