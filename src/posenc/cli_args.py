"""The one vocabulary of the ``posenc`` command line: options every subcommand spells and reads alike.

Every option that more than one subcommand takes is defined once, in :data:`OPTIONS` (flags, destination, type,
metavar, help), and added with :func:`add` or the group functions below. A subcommand chooses only the default,
whether the option is required or repeatable, and a note appended to the help (its default, what the result is);
``tests/test_cli_vocabulary.py`` walks every subcommand and holds it to that.

==========  ======================================================================================================
group       options
==========  ======================================================================================================
geometry    ``--hidden-size``, ``--num-heads``, ``--num-kv-heads``, ``--head-dim`` (default hidden // heads),
            ``--causal/--no-causal``, ``--max-position-embeddings`` (the model's context length)
tables      ``--table-mode precomputed|dynamic``, ``--max-positions`` (rows of precomputed tables)
dtype       ``--dtype fp32|fp16|bf16``
shapes      ``--shape B,S[,P][@START]``, optionally ``NAME:`` before it, or the presets ``prefill``/``decode``
checkpoint  ``--hf-model DIR`` (export) / ``--against-hf DIR`` (validate), ``--layer N``, ``--layer-type NAME``
output      ``-o/--output``, ``--json`` (print the result as JSON on stdout), ``--json-out FILE`` (write it)
run         ``-s/--scheme``, ``--unit``, ``--kv-cache concat|inplace``, ``--seed``, ``--threads``,
            ``--keep-models``, ``--quiet``, ``--engine-target``, ``--position-guard/--no-position-guard``

Paths given on the command line are never empty (:func:`path_arg`); what they point at is checked by
:mod:`posenc.artifacts.paths` before a subcommand opens or writes anything (:func:`check_output`, :func:`check_input`).
==========  ======================================================================================================

Old spellings (``bench --heads``, ``validate --json FILE``, ``--shape b=4,s=128``, ...) still parse for one
release, hidden from ``--help``, each with a deprecation note on stderr (the machinery: :mod:`posenc.cli_parser`).

This module imports only :mod:`posenc.errors`, :mod:`posenc.config`, :mod:`posenc.artifacts.paths` and
:mod:`posenc.export` (the unit names; the shape type), so the ``cli.py`` of every layer may use it. Those that need
torch (:mod:`posenc.config`, :mod:`posenc.export.units`) are imported where they are used, so that building the
parser (``posenc --help``) loads no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from posenc.artifacts.paths import input_file, output_path
from posenc.cli_parser import deprecation_note
from posenc.errors import ConfigError
from posenc.export.kinds import KV_CACHES, UNITS
from posenc.export.shapes import Shape, parse_named_shape

if TYPE_CHECKING:
    from posenc.config import AttentionConfig

# --------------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------------

DTYPES: tuple[str, ...] = ("fp32", "fp16", "bf16")
_DTYPE_SPELLINGS = {"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16", "bf16": "bf16",
                    "bfloat16": "bf16"}  # fmt: skip
TABLE_MODES: tuple[str, ...] = ("precomputed", "dynamic")
SHAPE_SYNTAX = "B,S[,P][@START]"


def dtype_arg(text: str) -> str:
    """``fp32``/``fp16``/``bf16`` (``float32``/``float16``/``bfloat16`` are read as the same)."""
    try:
        return _DTYPE_SPELLINGS[text.strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; use fp32, fp16 or bf16.") from None


def _choice(kind: str, choices: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"unknown {kind} {text!r}; use one of {', '.join(choices)}.")
        return text

    return parse


table_mode_arg = _choice("table mode", TABLE_MODES)


def path_arg(text: str) -> str:
    """A file or folder path: not empty and without NUL bytes. What it points at (a regular file, a folder, not a
    device or FIFO) is checked by :mod:`posenc.artifacts.paths` before the command opens or writes anything."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty; give a file or folder path.")
    if "\x00" in text:
        raise argparse.ArgumentTypeError(f"the path {text!r} holds a NUL byte; give a plain path.")
    return text


unit_arg = _choice("unit", UNITS)
kv_cache_arg = _choice("kv cache layout", KV_CACHES)


def parse_shape(text: str) -> tuple[str | None, Shape]:
    """Read a shape given on the command line: :func:`posenc.export.shapes.parse_named_shape`.

    The old benchmark form ``[NAME:]b=B,s=S[,past=P]`` is still read, with a deprecation note.

    Returns:
        ``(name or None, Shape)``.

    Raises:
        ConfigError: an unknown preset, a bad name, or numbers Shape refuses.
    """
    if "=" in text:
        text = _old_key_value_shape(text)
    return parse_named_shape(text)


_OLD_KEYS = {"b": 0, "batch": 0, "s": 1, "seq": 1, "p": 2, "past": 2}


def _old_key_value_shape(text: str) -> str:
    """``[NAME:]b=4,s=128[,past=P]`` -> ``[NAME:]4,128,P`` (the old `posenc bench --shape`), with a deprecation note."""
    name, sep, body = text.strip().rpartition(":")
    values: dict[int, str] = {}
    for item in body.split(","):
        key, _, value = item.strip().partition("=")
        slot = _OLD_KEYS.get(key.strip().lower())
        if slot is None:
            raise ConfigError(f"shape {text!r}: unknown item {item.strip()!r}; write {SHAPE_SYNTAX}, e.g. 4,128.")
        if slot in values:
            raise ConfigError(f"shape {text!r}: {key.strip()} is given twice.")
        values[slot] = value.strip()
    missing = [key for key, slot in (("b", 0), ("s", 1)) if slot not in values]
    if missing:
        raise ConfigError(f"shape {text!r} lacks {', '.join(missing)}; write {SHAPE_SYNTAX}, e.g. 4,128.")
    new = name + sep + ",".join(values.get(slot, "0") for slot in range(3))
    deprecation_note(f"shape {text.strip()!r} uses the old key=value form; write {new} ({SHAPE_SYNTAX}).")
    return new


def shape_arg(text: str) -> tuple[str | None, Shape]:
    """argparse type of ``--shape``: :func:`parse_shape`, its errors as usage errors (exit status 2)."""
    try:
        return parse_shape(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def print_result(data: Any, text: str, *, as_json: bool, written: Sequence[object] = ()) -> TextIO:
    """Print a command's result: ``data`` as JSON under ``--json``, else ``text``; then ``wrote PATH`` per file.

    Returns:
        the stream for further notes: stderr under ``--json``, so that stdout holds one JSON document.
    """
    if as_json:
        print(json.dumps(data, indent=2, default=str))
    else:
        print(text, end="" if text.endswith("\n") else "\n")
    notes = sys.stderr if as_json else sys.stdout
    for path in written:
        print(f"wrote {path}", file=notes)
    return notes


def check_output(path: str | None, what: str = "output", *, folder: bool = False) -> None:
    """Refuse, before the command works, an output the command could not write
    (:func:`posenc.artifacts.paths.output_path`: a folder where a file goes, a device, a FIFO, a path under a file).
    ``None`` (not given) passes."""
    if path is not None:
        output_path(path, what, folder=folder)


def check_input(path: str | None, what: str = "input file", missing: str = "check the path") -> None:
    """Refuse, before the command works, an input that is not a regular, non-empty file
    (:func:`posenc.artifacts.paths.input_file`; ``missing``: the remedy when it does not exist). ``None`` (not given)
    passes."""
    if path is not None:
        input_file(path, what, missing=missing)


def split_names(values: Sequence[str] | None) -> list[str]:
    """``-s a,b -s c`` -> ``[a, b, c]`` (repeatable name options also take comma-separated lists)."""
    return [v.strip() for value in values or [] for v in value.split(",") if v.strip()]


# --------------------------------------------------------------------------------------------------
# The shared options
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Option:
    """One shared option: the same flags, destination, type, metavar and help in every subcommand.

    Attributes:
        flags: option strings, e.g. ``("-o", "--output")``.
        help: what it means (a subcommand may append a note after ``"; "``, or after a final ``":"``).
        type: argparse type (``None`` for switches).
        metavar: shown in ``--help``.
        kind: ``value``, ``switch`` (``store_true``) or ``negatable`` (``--x/--no-x``).
    """

    flags: tuple[str, ...]
    help: str
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    kind: str = "value"

    @property
    def dest(self) -> str:
        return self.flags[-1].removeprefix("--").replace("-", "_")

    @property
    def option_strings(self) -> tuple[str, ...]:
        """What argparse lists: the flags, plus ``--no-X`` for a negatable ``--X``."""
        if self.kind != "negatable":
            return self.flags
        return (*self.flags, *(f"--no-{flag.removeprefix('--')}" for flag in self.flags))


def _choices_metavar(choices: Sequence[str]) -> str:
    return "{" + ",".join(choices) + "}"


def _options(*options: Option) -> dict[str, Option]:
    return {option.dest: option for option in options}


OPTIONS: dict[str, Option] = _options(
    # geometry
    Option(("--hidden-size",), "model width E (hidden states are [B, S, E])", int, "E"),
    Option(("--num-heads",), "query heads H", int, "H"),
    Option(("--num-kv-heads",), "key/value heads (grouped-query attention; default: --num-heads)", int, "HKV"),
    Option(("--head-dim",), "per-head width D (default: --hidden-size // --num-heads)", int, "D"),
    Option(("--causal",), "causal mask (a decoder) or none (--no-causal, an encoder)", kind="negatable"),
    Option(
        ("--max-position-embeddings",), "the model's context length (config.json's max_position_embeddings)", int, "N"
    ),
    # tables
    Option(
        ("--table-mode",),
        "precomputed: position tables stored in the graph; dynamic: computed in the graph from the position ids "
        "(no length limit)",
        table_mode_arg,
        _choices_metavar(TABLE_MODES),
    ),
    Option(("--max-positions",), "rows of precomputed position tables: positions 0 .. N-1", int, "N"),
    # dtype
    Option(
        ("--dtype",), "dtype of the graph's activations; position tables stay fp32", dtype_arg, _choices_metavar(DTYPES)
    ),
    # shapes
    Option(
        ("--shape",),
        f"{SHAPE_SYNTAX}: batch, new tokens, cached tokens (default 0), first position (default P), e.g. 2,7,5 "
        "or 1,4,0@32764; NAME: before it labels it; presets prefill (1,512) and decode (1,1,511)",
        shape_arg,
        "SHAPE",
    ),
    # checkpoint
    Option(
        ("--hf-model",),
        "local Hugging Face checkpoint folder (config.json + *.safetensors or pytorch_model.bin); never downloads",
        path_arg,
        "DIR",
    ),
    Option(
        ("--against-hf",),
        "also compare with the attention module of this local Hugging Face checkpoint folder (needs transformers)",
        path_arg,
        "DIR",
    ),
    Option(("--layer",), "layer index in the checkpoint", int, "N"),
    Option(
        ("--layer-type",),
        "stack or layer type where the model has several (T5: encoder/decoder; Gemma 3: sliding_attention/"
        "full_attention)",
        str,
        "NAME",
    ),
    # output
    Option(("-o", "--output"), "where to write:", path_arg, "PATH"),
    Option(("--json",), "print the result as JSON on stdout (instead of text):", kind="switch"),
    Option(("--json-out",), "write the result as JSON to this file:", path_arg, "FILE"),
    # run
    Option(("-s", "--scheme"), "registered scheme name (see `posenc list`)", str, "NAME"),
    Option(
        ("--unit",),
        "block: the whole attention block; op: the scheme's positional op alone; op-3d: RoPE on the [B, S, H*D] "
        "projection layout",
        unit_arg,
        _choices_metavar(UNITS),
    ),
    Option(
        ("--kv-cache",),
        "the block's KV cache: concat (past in, past + new out: every step copies the cache) or inplace (a "
        "preallocated cache of max-positions slots, new slots written in place; opset 24)",
        kv_cache_arg,
        _choices_metavar(KV_CACHES),
    ),
    Option(("--seed",), "random seed", int, "N"),
    Option(("--threads",), "intra-op threads of PyTorch and ONNX Runtime", int, "N"),
    Option(("--keep-models",), "keep the ONNX graphs (and engines) under OUT/models", kind="switch"),
    Option(("--quiet",), "no progress output", kind="switch"),
    Option(("--engine-target",), "compute capability of the TensorRT engine, e.g. sm89", str, "SM"),
    Option(
        ("--position-guard",),
        "guard the graph's positions: a position outside its table (or negative) raises in ONNX Runtime and gives "
        "NaN in TensorRT instead of a plausible number (--no-position-guard leaves the guard out)",
        kind="negatable",
    ),
)
"""Every shared option, by destination."""

GEOMETRY: tuple[str, ...] = (
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "causal",
    "max_position_embeddings",
)


def add(
    target: argparse._ActionsContainer,
    dest: str,
    *,
    note: str = "",
    default: Any = None,
    required: bool = False,
    repeat: bool = False,
) -> argparse.Action:
    """Add the shared option ``dest`` (a key of :data:`OPTIONS`) to a parser or argument group.

    Args:
        note: appended to the shared help after ``"; "`` (this subcommand's default, what the result is).
        default: this subcommand's default (``None``: not given).
        required: the subcommand cannot run without it.
        repeat: the option may be given several times (``append``: a list, ``None`` when never given); the help
            says "repeatable".
    """
    option = OPTIONS[dest]
    text = "; ".join(part for part in (option.help, "repeatable" if repeat else "", note) if part)
    text = text.replace(":; ", ": ")  # "where to write:" + note reads "where to write: the .onnx file"
    if option.kind == "switch":
        return target.add_argument(*option.flags, action="store_true", help=text)
    if option.kind == "negatable":
        return target.add_argument(*option.flags, action=argparse.BooleanOptionalAction, default=default, help=text)
    return target.add_argument(
        *option.flags,
        type=option.type or str,
        metavar=option.metavar,
        action="append" if repeat else "store",
        default=default,
        required=required,
        help=text,
    )


def add_geometry(parser: argparse.ArgumentParser, title: str) -> None:
    """The attention geometry group; read it back with :func:`config_from_args`."""
    group = parser.add_argument_group(title)
    for dest in GEOMETRY:
        add(group, dest)


def config_from_args(args: argparse.Namespace, base: AttentionConfig) -> AttentionConfig:
    """``base`` with the geometry options given on the command line.

    The same rule in every subcommand: a new ``--num-heads`` brings the key/value heads along unless
    ``--num-kv-heads`` is given; a new ``--hidden-size`` or ``--num-heads`` makes ``head_dim`` = hidden size //
    heads unless ``--head-dim`` is given.

    Raises:
        ConfigError: the resulting geometry is invalid (e.g. heads that do not divide).
    """
    given = {name: getattr(args, name, None) for name in GEOMETRY}
    fields = base.to_dict()
    if given["num_heads"] is not None and given["num_kv_heads"] is None:
        fields["num_kv_heads"] = None  # follow the new head count
    if (given["hidden_size"] is not None or given["num_heads"] is not None) and given["head_dim"] is None:
        fields["head_dim"] = None  # derive from the new sizes
    fields.update({name: value for name, value in given.items() if value is not None})
    return type(base).from_dict(fields)


def geometry_given(args: argparse.Namespace) -> list[str]:
    """The geometry options given on the command line, as flags (for "drop ..." messages)."""
    return [OPTIONS[name].flags[-1] for name in GEOMETRY if getattr(args, name, None) is not None]


# --------------------------------------------------------------------------------------------------
# Old spellings and the parser
# --------------------------------------------------------------------------------------------------


__all__ = [
    "DTYPES",
    "GEOMETRY",
    "OPTIONS",
    "SHAPE_SYNTAX",
    "TABLE_MODES",
    "Option",
    "add",
    "add_geometry",
    "check_input",
    "check_output",
    "config_from_args",
    "dtype_arg",
    "geometry_given",
    "parse_shape",
    "path_arg",
    "print_result",
    "shape_arg",
    "split_names",
]
