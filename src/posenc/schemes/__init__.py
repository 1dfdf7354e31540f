"""The scheme registry: every positional-encoding scheme registers itself here exactly once.

The registry drives ``posenc list``, the export and parity matrices and the docs. Adding a scheme means
one module (or one section of a family module) that calls :func:`register` (from
:mod:`posenc.schemes.registry`), plus its tests.
"""

from __future__ import annotations

from posenc.schemes.base import (
    DEFAULT_TOLERANCES,
    Param,
    Placement,
    PositionalScheme,
    SchemeSpec,
    TableMode,
    Tolerance,
)
from posenc.schemes.registry import (
    build_scheme,
    get_spec,
    register,
    scheme_class,
    scheme_names,
    specs,
    unregister,
)

__all__ = [
    "DEFAULT_TOLERANCES",
    "Param",
    "Placement",
    "PositionalScheme",
    "SchemeSpec",
    "TableMode",
    "Tolerance",
    "build_scheme",
    "get_spec",
    "register",
    "scheme_class",
    "scheme_names",
    "specs",
    "unregister",
]

# Family modules register their schemes on import (through posenc.schemes.registry).
from posenc.schemes import absolute, alibi, deberta, nope, relative, rerope, rope, rope_linear, t5, tupe  # noqa: F401
