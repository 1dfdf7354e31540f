"""Typed records <-> JSON: the one place posenc turns its result dataclasses into JSON objects and back.

Every stage hands the next one a dataclass (manifests, pipeline and benchmark records), never a dict read by
string keys; files hold the JSON form. :func:`to_json` writes every field of a record under its key;
:func:`from_json` reads strictly: a key the record does not know, a missing key or a value of the wrong type
raises :class:`RecordError`, so a renamed key fails loudly instead of falling back to a default.

Field types: ``str``, ``int``, ``float``, ``bool``, ``None``, ``Any`` (kept as is), enums, ``Literal``, paths,
nested records, ``list[X]``, ``tuple[X, ...]``, ``tuple[X, Y]``, ``dict[str, X]`` and unions of these (tried in
order; records in a union are told apart by a ``Literal`` field such as ``kind``).

Options, both explicit per record:

- :func:`field` ``key=``: the JSON key when it differs from the attribute (``median`` stored as ``median_s``);
  ``optional=True``: the key may be absent (the default is used) and is left out while the value equals the
  default (keys only some files carry).
- ``JSON_DERIVED: ClassVar[tuple[str, ...]]``: read-only properties written for readers of the file (a
  verdict, a unit conversion) and skipped when read back.

Example::

    @dataclasses.dataclass(frozen=True)
    class Timing:
        median: float = field(key="median_s")
        runs: int

    to_json(Timing(0.5, 3))                    # {"median_s": 0.5, "runs": 3}
    from_json(Timing, {"median": 0.5, "runs": 3}, "timing")   # RecordError: unknown key 'median', missing 'median_s'
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any, ClassVar, TypeVar

from posenc.errors import ModelFileError

R = TypeVar("R")

_KEY = "posenc.records.key"
_OPTIONAL = "posenc.records.optional"


class RecordError(ModelFileError):
    """A JSON record lacks a field, has one its type does not know, or holds a value of the wrong type."""


def field(
    *, key: str | None = None, optional: bool = False, default: Any = dataclasses.MISSING, default_factory: Any = None
) -> Any:
    """A dataclass field with a JSON ``key`` other than its name and/or ``optional`` in files (see the module)."""
    if optional and default is dataclasses.MISSING and default_factory is None:
        raise TypeError("an optional record field needs a default (the value an absent key stands for)")
    metadata = field_metadata(key=key, optional=optional)
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_metadata(*, key: str | None = None, optional: bool = False) -> dict[str, Any]:
    """What :func:`field` records, for a ``dataclasses.field`` that needs more (``kw_only=True``, which type
    checkers read only from ``dataclasses.field`` itself)."""
    return {_KEY: key, _OPTIONAL: optional}


def _json_key(f: dataclasses.Field) -> str:
    return f.metadata.get(_KEY) or f.name


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


def to_json(value: Any) -> Any:
    """The JSON form of a record (or of any value a record field may hold): dicts, lists, scalars."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        data: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.metadata.get(_OPTIONAL) and item == _default(f):
                continue
            data[_json_key(f)] = to_json(item)
        for name in getattr(type(value), "JSON_DERIVED", ()):
            data[name] = to_json(getattr(value, name))
        return data
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if value is None or isinstance(value, (str, int, float)):
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"{type(value).__name__} is not a JSON record value: {value!r}")


class Document:
    """A record stored as a file of its own (manifests, ``bench.json``, ``demo.json``): a mixin of the dataclass.

    The dataclass has a ``format`` field defaulting to :attr:`FORMAT`; its JSON object starts with that key,
    and reading refuses another format before anything else, with :attr:`REMEDY` (what to do instead).
    """

    FORMAT: ClassVar[str]
    REMEDY: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        data = to_json(self)
        return {"format": data.pop("format"), **data}

    @classmethod
    def from_dict(cls: type[R], data: Any, what: str = "") -> R:
        """Read the document strictly (:func:`from_json`).

        Raises:
            RecordError: another format, or missing, unknown or malformed keys; the message says what to do.
        """
        what = what or f"the {cls.__name__}"
        found = data.get("format") if isinstance(data, Mapping) else None
        if found != cls.FORMAT:  # type: ignore[attr-defined]  # FORMAT/REMEDY: class attributes of each record type
            raise RecordError(f"{what} has format {found!r}, not {cls.FORMAT!r}; {cls.REMEDY}.")  # type: ignore[attr-defined]  # set by each record type
        return from_json(cls, data, what, cls.REMEDY)  # type: ignore[attr-defined]  # set by each record type


# --------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------


def from_json(cls: type[R], data: Any, what: str = "record", remedy: str = "") -> R:
    """Read a record of type ``cls`` from its JSON form, strictly (see the module docstring).

    Args:
        cls: the record's dataclass.
        data: the parsed JSON.
        what: names the file or record in error messages (``"manifest model.manifest.json"``).
        remedy: what the user should do, appended to error messages (``"re-export the model"``).

    Raises:
        RecordError: unknown or missing keys, or values of the wrong type (the message gives the path).
    """
    try:
        return _decode(cls, data, "")
    except _MismatchError as exc:
        where = f" at {exc.path}" if exc.path else ""
        raise RecordError(f"{what}{where}: {exc.problem}" + (f"; {remedy}" if remedy else "")) from None


class _MismatchError(Exception):
    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, problem)
        self.path, self.problem = path, problem


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _join(path: str, key: str | int) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)


def _decode(tp: Any, value: Any, path: str) -> Any:
    if tp is Any or tp is object:
        return value
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return _decode_union(typing.get_args(tp), value, path)
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise _MismatchError(path, f"{value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if origin is not None:
        return _decode_container(origin, typing.get_args(tp), value, path)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _decode_record(tp, value, path)
    if tp is type(None):
        if value is not None:
            raise _MismatchError(path, f"expected null, got {value!r}")
        return None
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise _MismatchError(path, f"{value!r} is not one of {[m.value for m in tp]}") from None
    if isinstance(tp, type) and issubclass(tp, PurePath):
        return tp(_scalar(str, value, path))
    if tp in (str, int, float, bool):
        return _scalar(tp, value, path)
    raise TypeError(f"posenc.records cannot read fields of type {tp!r} (at {path or 'the top'})")


def _scalar(tp: type, value: Any, path: str) -> Any:
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, tp) and (tp is bool or not isinstance(value, bool)):
        return value
    raise _MismatchError(path, f"expected {tp.__name__}, got {type(value).__name__} {value!r}")


def _decode_union(options: tuple[Any, ...], value: Any, path: str) -> Any:
    if value is None and type(None) in options:
        return None
    real = [option for option in options if option is not type(None)]
    if len(real) == 1:  # X | None: X's own message says what is wrong
        return _decode(real[0], value, path)
    problems = []
    for option in options:
        if option is type(None):
            continue
        try:
            return _decode(option, value, path)
        except _MismatchError as exc:
            problems.append(f"as {getattr(option, '__name__', option)}: {exc.problem}")
    raise _MismatchError(path, "matches none of its types (" + "; ".join(problems) + ")")


def _decode_container(origin: Any, args: tuple[Any, ...], value: Any, path: str) -> Any:
    if origin in (dict, Mapping) or (isinstance(origin, type) and issubclass(origin, Mapping)):
        if not isinstance(value, Mapping):
            raise _MismatchError(path, f"expected an object, got {type(value).__name__}")
        item = args[1] if len(args) == 2 else Any
        return {str(k): _decode(item, v, _join(path, str(k))) for k, v in value.items()}
    if origin in (list, tuple) or (isinstance(origin, type) and issubclass(origin, Sequence)):
        if not isinstance(value, (list, tuple)):
            raise _MismatchError(path, f"expected a list, got {type(value).__name__}")
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise _MismatchError(path, f"expected {len(args)} items, got {len(value)}")
            return tuple(_decode(t, v, _join(path, i)) for i, (t, v) in enumerate(zip(args, value, strict=True)))
        item = args[0] if args else Any
        items = [_decode(item, v, _join(path, i)) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    raise TypeError(f"posenc.records cannot read fields of type {origin!r} (at {path or 'the top'})")


def _decode_record(cls: type, value: Any, path: str) -> Any:
    if not isinstance(value, Mapping):
        raise _MismatchError(path, f"expected an object ({cls.__name__}), got {type(value).__name__}")
    fields = [f for f in dataclasses.fields(cls) if f.init]
    keys = {_json_key(f): f for f in fields}
    unknown = sorted(set(value) - set(keys) - set(getattr(cls, "JSON_DERIVED", ())))
    missing = sorted(k for k, f in keys.items() if k not in value and not f.metadata.get(_OPTIONAL))
    if unknown or missing:
        parts = ([f"unknown key(s) {unknown}"] if unknown else []) + ([f"missing key(s) {missing}"] if missing else [])
        raise _MismatchError(path, f"{cls.__name__} has " + " and ".join(parts))
    hints = _hints(cls)
    kwargs = {f.name: _decode(hints[f.name], value[key], _join(path, key)) for key, f in keys.items() if key in value}
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:  # the record's own checks (__post_init__), e.g. ConfigError
        raise _MismatchError(path, f"{cls.__name__} rejects its values ({exc})") from None
