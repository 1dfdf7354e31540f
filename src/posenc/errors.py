"""Errors raised by posenc.

Every error says what was wrong and what to do about it. User input is never checked with ``assert``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class PosencError(Exception):
    """Base class of every error posenc raises on purpose."""


class ConfigError(PosencError, ValueError):
    """A scheme, attention or export parameter is invalid (the message names the valid values)."""


class PositionError(PosencError, IndexError):
    """Position ids fall outside what a precomputed table covers."""


class ExportError(PosencError):
    """Exporting a module to ONNX failed or is not supported for the requested options."""


class ModelFileError(PosencError):
    """An ONNX or engine file is missing, truncated, corrupt or does not match its manifest."""


class BackendUnavailable(PosencError, ImportError):  # noqa: N818 (a public name of the posenc API since v0.1.0)
    """An optional backend (tensorrt, tensorrt_rtx, triton, transformers, ...) is not installed."""


class BuildError(PosencError):
    """Building a TensorRT engine or a kernel failed."""


class ParityError(PosencError):
    """A deployed artifact does not reproduce the eager PyTorch reference within tolerance."""


@contextlib.contextmanager
def parameter_domain(what: str, remedy: str) -> Iterator[None]:
    """Turn the math's own errors inside the block (``ArithmeticError``, ``ValueError``, ``RuntimeError``: a
    parameter outside its domain, found by computing with it) into a :class:`ConfigError`
    ``"{what} (<error>); {remedy}"``; posenc's own errors pass through unchanged."""
    try:
        yield
    except PosencError:
        raise
    except (ArithmeticError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"{what} ({type(exc).__name__}: {str(exc)[:200]}); {remedy}") from None
