"""The ``posenc`` command line: one subcommand per pipeline arrow.

Subcommands other than ``list`` and ``show`` live next to the code they drive (``posenc/<part>/cli.py``,
and ``posenc/demo.py`` for the demo, each exposing ``register(subparsers)``); this module wires them up.
Options that several subcommands take are spelled and read the same everywhere: :mod:`posenc.cli_args`.

Exit statuses: 0 success; 1 a check failed (``validate`` mismatch, ``bench --fail-on-miss``); 2 bad input
(a usage error, :class:`PosencError`, or a file the system refused, with a one-line message); 3 an internal
error (a posenc bug or an unhandled backend failure: the traceback is printed); 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING

from posenc import __version__
from posenc.cli_args import PosencParser, add
from posenc.errors import PosencError

if TYPE_CHECKING:  # annotations only: `posenc --help` loads neither onnx nor ONNX Runtime
    from posenc.export.manifest import OutputDrift
    from posenc.graphs.manifests import ModelInfo

# Modules that contribute subcommands, in the order of the pipeline.
COMMAND_MODULES: tuple[str, ...] = (
    "posenc.export.cli",
    "posenc.graphs.cli",
    "posenc.engine.cli",
    "posenc.validate.cli",
    "posenc.bench.cli",
    "posenc.demo",
    "posenc.census.cli",
)


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
    from posenc.validate.compare import check_ort_parity

    return check_ort_parity(before, after, info)


def inspect_tensorrt_check(path: object) -> object:
    """The TensorRT parse of ``posenc inspect``: :func:`posenc.engine.check_parse`.

    Composed here because ``posenc.graphs`` sits below ``posenc.engine`` and does not import it.
    """
    from posenc.engine.parse_check import check_parse

    return check_parse(path)  # type: ignore[arg-type]  # the caller passes a path-like object


def build_parser() -> argparse.ArgumentParser:
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
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    sub.choices["optimize"].set_defaults(parity_check=optimize_parity_check)
    sub.choices["inspect"].set_defaults(tensorrt_check=inspect_tensorrt_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``) and return its exit status."""
    parser = build_parser()
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
    except KeyboardInterrupt:
        print(f"posenc {args.command}: interrupted", file=sys.stderr)
        return 130
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
