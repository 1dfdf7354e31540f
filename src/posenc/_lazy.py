"""Lazy re-exports for package ``__init__`` modules, so ``posenc --help`` imports no heavy backend."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` that import each name from its module on first use.

    Args:
        package: the package's ``__name__``.
        exports: public name -> module that defines it; a name whose module is ``package.name`` is that submodule.

    Example::

        _EXPORTS = {"build_engine": "posenc.engine.build"}
        __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
    """

    def get_attribute(name: str) -> Any:
        if name in exports:
            module = importlib.import_module(exports[name])
            value = module if module.__name__ == f"{package}.{name}" else getattr(module, name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def list_names() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return get_attribute, list_names
