"""Which TensorRT is used: datacenter ``tensorrt`` when importable, else ``tensorrt_rtx``.

``tensorrt`` builds and runs engines on the NVIDIA GPU of the machine; ``tensorrt_rtx`` builds ahead of
time, without a GPU, for chosen compute capabilities, and cannot run what it builds without one. Both are
imported lazily; neither is a core dependency.

One TensorRT logger serves the whole process (TensorRT ignores a second one); it is shared with polygraphy's
loaders so they do not create their own.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import threading
from types import ModuleType
from typing import Any

from posenc.errors import BackendUnavailable, ConfigError

BACKENDS: tuple[str, ...] = ("tensorrt", "tensorrt_rtx")
INSTALL_HINT = (
    "install TensorRT-RTX to build engines ahead of time without a GPU (`pip install tensorrt-rtx-cu13`, or "
    "`pip install posenc[rtx]`), or datacenter TensorRT on a machine with an NVIDIA GPU (`pip install tensorrt`)"
)
NOISE = ("cudaError 35", "CUDA driver version is insufficient", "CUDA initialization failure")


@dataclasses.dataclass(frozen=True)
class Backend:
    """A loaded TensorRT module.

    Attributes:
        name: ``tensorrt`` or ``tensorrt_rtx``.
        trt: the imported module.
        version: its ``__version__``.
    """

    name: str
    trt: ModuleType
    version: str

    @property
    def is_rtx(self) -> bool:
        return self.name == "tensorrt_rtx"

    @property
    def has_timing_cache(self) -> bool:
        """TensorRT-RTX's timing cache forces a GPU query during ahead-of-time builds; only datacenter uses one."""
        return not self.is_rtx

    def describe(self) -> str:
        return f"{self.name} {self.version}"


_LOCK = threading.Lock()
_LOADED: dict[str, Backend] = {}


def _import(name: str) -> ModuleType:
    return importlib.import_module(name)


def load_backend(name: str | None = None) -> Backend:
    """Import a TensorRT backend.

    Args:
        name: ``tensorrt``, ``tensorrt_rtx``, or ``None`` for ``tensorrt`` when importable, else ``tensorrt_rtx``.

    Raises:
        ConfigError: ``name`` is not a known backend.
        BackendUnavailable: the backend (or, with ``None``, both) cannot be imported; says what to install.
    """
    if name is not None and name not in BACKENDS:
        raise ConfigError(f"unknown TensorRT backend {name!r}; use one of {list(BACKENDS)}.")
    candidates = [name] if name else list(BACKENDS)
    failures = []
    with _LOCK:
        for candidate in candidates:
            if candidate in _LOADED:
                return _LOADED[candidate]
            try:
                module = _import(candidate)
            except ImportError as exc:  # also OSError-free ImportErrors of broken installs
                failures.append(f"{candidate}: {exc}")
                continue
            backend = Backend(candidate, module, str(getattr(module, "__version__", "unknown")))
            _LOADED[candidate] = backend
            return backend
    raise BackendUnavailable(f"no TensorRT backend could be imported ({'; '.join(failures)}); {INSTALL_HINT}.")


def available_backends() -> list[str]:
    """Names of the backends that import here (none raises nothing)."""
    names = []
    for candidate in BACKENDS:
        try:
            load_backend(candidate)
        except BackendUnavailable:
            continue
        names.append(candidate)
    return names


def configure_polygraphy(backend: Backend) -> None:
    """Point polygraphy's TensorRT loaders at ``backend`` before they are imported.

    Polygraphy picks ``tensorrt`` or ``tensorrt_rtx`` from ``POLYGRAPHY_USE_TENSORRT_RTX`` when its TensorRT
    modules are first imported; importing them earlier for the other backend cannot be undone.

    Raises:
        BackendUnavailable: polygraphy's TensorRT modules were already imported for the other backend.
    """
    os.environ["POLYGRAPHY_USE_TENSORRT_RTX"] = "1" if backend.is_rtx else "0"
    import polygraphy.config

    polygraphy.config.USE_TENSORRT_RTX = backend.is_rtx
    import polygraphy.backend.trt.util as trt_util

    try:
        bound = str(trt_util.trt.__name__)
    except Exception as exc:  # polygraphy tried the other module (imported earlier in this process)
        bound = f"unavailable ({exc})"
    if bound != backend.name:
        raise BackendUnavailable(
            f"polygraphy's TensorRT loaders are bound to {bound} in this process, not {backend.name}; run posenc "
            f"in a fresh process with POLYGRAPHY_USE_TENSORRT_RTX={int(backend.is_rtx)} set before anything imports "
            f"polygraphy's TensorRT modules."
        )
    if trt_util.TRT_LOGGER is None:
        trt_util.TRT_LOGGER = trt_logger(backend)


class _Collector:
    """Messages of error severity seen by the process logger since :meth:`start`."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def start(self) -> None:
        self.errors = []


_LOGGERS: dict[str, Any] = {}
ERRORS = _Collector()


def trt_logger(backend: Backend) -> Any:
    """The process-wide TensorRT logger of ``backend``: errors are kept in :data:`ERRORS` for error messages.

    Everything is printed to stderr when ``POSENC_TRT_VERBOSE`` is set.

    The harmless "cudaError 35" line of GPU-less ahead-of-time builds is dropped.
    """
    import polygraphy.backend.trt.util as trt_util

    if backend.name in _LOGGERS:
        return _LOGGERS[backend.name]
    existing = getattr(trt_util, "TRT_LOGGER", None)
    if existing is not None and isinstance(existing, backend.trt.ILogger):
        _LOGGERS[backend.name] = existing
        return existing
    trt = backend.trt

    class PosencTrtLogger(trt.ILogger):  # type: ignore[name-defined]  # trt is the module imported at run time
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            if any(noise in msg for noise in NOISE):
                return
            if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                ERRORS.errors.append(msg)
            if os.environ.get("POSENC_TRT_VERBOSE"):
                import sys

                print(f"[{backend.name}] {msg}", file=sys.stderr)

    logger = PosencTrtLogger()
    _LOGGERS[backend.name] = logger
    return logger
