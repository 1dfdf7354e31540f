"""The ``posenc`` command line: one subcommand per pipeline arrow.

Subcommands other than ``list`` and ``show`` live next to the code they drive (``posenc/<stage>/cli.py``, each
exposing ``register(subparsers)``); this module wires them up. It imports
a subcommand's module (and builds its parser) only when that subcommand is chosen: ``posenc --help`` lists the
others from :data:`COMMANDS` and loads no torch, onnx or ONNX Runtime (``tests/test_cli_startup.py``).
Options that several subcommands take are spelled and read the same everywhere: :mod:`posenc.cli_args`.

Exit statuses: 0 success; 1 a check failed (``validate`` mismatch, ``bench --fail-on-miss``); 2 bad input
(a usage error, :class:`PosencError`, or a file the system refused, with a one-line message); 3 an internal
error (a posenc bug or an unhandled backend failure: the traceback is printed); 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING

from posenc import __version__
from posenc.cli_args import add
from posenc.cli_parser import PosencParser
from posenc.errors import PosencError
from posenc.process import batch_gc

if TYPE_CHECKING:  # annotations only: `posenc --help` loads neither onnx nor ONNX Runtime
    from posenc.export.manifest import OutputDrift
    from posenc.graphs.manifests import ModelInfo

# Subcommands in the order of the pipeline: name -> (the module whose `register` adds it, the help line that
# `posenc --help` shows without importing that module; a test holds it equal to the module's own).
COMMANDS: dict[str, tuple[str, str]] = {
    "export": (
        "posenc.export.cli",
        "export a scheme's op or an attention block to ONNX (with manifest and weights)",
    ),
    "optimize": (
        "posenc.graphs.cli",
        "fold constants, fuse RoPE and attention for ONNX Runtime CPU or TensorRT",
    ),
    "inspect": (
        "posenc.graphs.cli",
        "op histogram, initializer bytes, fusions applied, whether TensorRT parses it",
    ),
    "build": (
        "posenc.engine.cli",
        "build a TensorRT engine (tensorrt or tensorrt_rtx) from an ONNX file",
    ),
    "validate": (
        "posenc.validate.cli",
        "compare an exported ONNX model with its float64 eager PyTorch reference (polygraphy)",
    ),
    "sweep": (
        "posenc.validate.cli",
        "error against position (to 131072) of exported positional ops, per position bucket",
    ),
    "bench": (
        "posenc.bench.cli",
        "latency of each scheme's op and block per backend, vs the copy-bandwidth roofline",
    ),
    "demo": (
        "posenc.demo.cli",
        "run the whole pipeline for every scheme and write a report (no arguments needed)",
    ),
    "models": (
        "posenc.census.cli",
        "model types posenc loads checkpoints of; --census: every transformers text type -> docs/models.md",
    ),
}


def _list(args: argparse.Namespace) -> int:
    from posenc.schemes import specs

    rows = specs()
    if args.json:
        print(json.dumps([s.to_dict() for s in rows], indent=2))
        return 0
    header = ("scheme", "family", "acts at", "table modes", "parameters")
    table = [
        (
            s.name,
            s.family,
            s.placement.value,
            ",".join(sorted(m.value for m in s.table_modes)),
            ", ".join(s.param_names()) or "-",
        )
        for s in rows
    ]
    widths = [max(len(str(r[i])) for r in [header, *table]) for i in range(4)]
    for row in [header, *table]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4])
    print(f"\n{len(rows)} schemes. `posenc show SCHEME` for parameters, defaults and citations.")
    return 0


def _show(args: argparse.Namespace) -> int:
    from posenc.schemes import get_spec

    spec = get_spec(args.scheme)
    data = spec.to_dict()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"{spec.name}: {spec.title}")
    print(f"  {spec.summary}")
    print(f"  family: {spec.family}; acts at: {spec.placement.value}; table modes: {', '.join(data['table_modes'])}")
    print(f"  exports: {', '.join(data['exports'])}")
    print("  parameters:")
    if not spec.params:
        print("    (none)")
    for p in spec.params:
        choices = f" one of {list(p.choices)}" if p.choices else ""
        print(f"    {p.name} ({p.kind}, default {p.default!r}){choices}: {p.doc}")
    print("  tolerances vs float64 reference:")
    for dtype, tol in spec.tolerances.items():
        print(f"    {dtype}: atol={tol.atol:g} rtol={tol.rtol:g}")
    print(f"  citation: {spec.citation}")
    if spec.verified_against:
        print(f"  verified against: {spec.verified_against}")
    return 0


def optimize_parity_check(before: bytes, after: bytes, info: ModelInfo) -> dict[str, OutputDrift]:
    """The before/after check of ``posenc optimize``: :func:`posenc.validate.check_ort_parity`.

    Composed here because ``posenc.graphs`` sits below ``posenc.validate`` and does not import it; imported on
    use so that ``posenc --help`` does not load ONNX Runtime or polygraphy.
    """
    from posenc.validate.optimize_check import check_ort_parity

    return check_ort_parity(before, after, info)


def inspect_engine_profiles(manifest: object) -> str:
    """The engine profiles of ``posenc inspect``: :func:`posenc.engine.build.engine_profiles`, formatted (composed
    here for the same reason as :func:`inspect_tensorrt_check`)."""
    from posenc.engine.build import engine_profiles
    from posenc.engine.profiles import format_profiles

    return format_profiles(engine_profiles(manifest))  # type: ignore[arg-type]  # a Manifest or None


def inspect_tensorrt_check(path: object) -> object:
    """The TensorRT parse of ``posenc inspect``: :func:`posenc.engine.check_parse`.

    Composed here because ``posenc.graphs`` sits below ``posenc.engine`` and does not import it.
    """
    from posenc.engine.parse_check import check_parse

    return check_parse(path)  # type: ignore[arg-type]  # the caller passes a path-like object


def chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand that ``argv`` names: its first word that is not an option (the top level takes no values)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(load: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The ``posenc`` parser.

    Args:
        load: the subcommands to build in full (their modules imported, with every subcommand those modules add);
            every other one is a stub that only lists its name and help. ``None``: all of them (what tests and
            documentation tools walk).
    """
    parser = PosencParser(
        prog="posenc",
        description="Positional encodings from an exact PyTorch reference to verified ONNX Runtime / TensorRT "
        "deployments: list -> export -> optimize -> build -> validate -> bench. Options mean the same in every "
        "subcommand: --json prints the result as JSON on stdout, shapes are B,S[,P][@START], --max-positions "
        "counts table rows and --max-position-embeddings is the model's context length.",
        epilog="Examples:\n  posenc list\n  posenc show rope_yarn\n  posenc demo --quick -o report",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser(
        "list",
        help="table of every registered scheme",
        description="Table of schemes: family, where it acts, table modes, parameters.",
        epilog="examples:\n  posenc list\n  posenc list --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add(p, "json", note="one object per scheme")
    p.set_defaults(func=_list)
    p = sub.add_parser(
        "show",
        help="parameters, defaults, meaning and citation of one scheme",
        description="Describe one scheme.",
        epilog="examples:\n  posenc show rope_yarn\n  posenc show alibi --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scheme", help="scheme name (see `posenc list`)")
    add(p, "json", note="the scheme's description")
    p.set_defaults(func=_show)
    wanted = None if load is None else {COMMANDS[name][0] for name in load if name in COMMANDS}
    loaded: set[str] = set()
    for name, (module, help_line) in COMMANDS.items():
        if wanted is None or module in wanted:
            if module not in loaded:
                importlib.import_module(module).register(sub)  # all of the module's subcommands, in its order
                loaded.add(module)
        elif name not in sub.choices:
            sub.add_parser(name, help=help_line, add_help=False)
    if "posenc.graphs.cli" in loaded:
        sub.choices["optimize"].set_defaults(parity_check=optimize_parity_check)
        sub.choices["inspect"].set_defaults(tensorrt_check=inspect_tensorrt_check, profile_text=inspect_engine_profiles)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (what ``timeout`` and job schedulers send), raised where the process is, like Ctrl-C: every
    ``finally`` runs, staging and scratch are removed, partial reports are written as interrupted."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


@contextlib.contextmanager
def _process_setup() -> Iterator[None]:
    """SIGTERM handled like Ctrl-C for the command's duration (main thread, default handler only), output that
    an encoding cannot show written with backslash escapes instead of a crash (``PYTHONIOENCODING=ascii``), and the
    collector's thresholds of a batch job (:func:`posenc.process.batch_gc`)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(Exception):
                reconfigure(errors="backslashreplace")
    previous = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        with batch_gc():
            yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``) and return its exit status."""
    with _process_setup():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = chosen_command(argv)
    parser = build_parser(load=() if command is None else (command,))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help and --version (0), or a usage error already printed as one line (2)
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None) * 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe surfaces here, inside the handler below
        return status
    except PosencError as exc:
        print(f"posenc {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        print(f"posenc {args.command}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    except BrokenPipeError:
        # The reader went away (`posenc list | head`); silence the flush at interpreter exit too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a path the system refused (exists as a file, no permission, disk full, ...)
        print(f"posenc {args.command}: error: {exc}; check the paths you gave.", file=sys.stderr)
        return 2
    except Exception as exc:  # not a user error: show where, but keep 1 for "a check failed"
        traceback.print_exc()
        print(
            f"posenc {args.command}: internal error ({type(exc).__name__}); this is a posenc bug or a backend "
            f"failure posenc does not handle yet: please report it with the traceback above.",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
