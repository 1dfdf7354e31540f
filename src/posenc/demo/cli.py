"""``posenc demo`` on the command line: options -> :class:`posenc.demo.records.DemoOptions` ->
:func:`posenc.demo.pipeline.run_demo`, then a two-line summary (or ``demo.json`` with ``--json``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.bench.plan import resolve_schemes
from posenc.cli_args import add, check_output, split_names
from posenc.demo.checkpoints import checkpoint_section
from posenc.demo.pipeline import RESULT_NAME, check_engine_targets, run_demo
from posenc.demo.records import DemoOptions

EPILOG = """\
Examples:
  posenc demo                          # every scheme, both table modes, Llama-like block -> ./report
  posenc demo --quick -o /tmp/report   # tiny block, one table mode per scheme (about a minute)
  posenc demo -s rope -s alibi -o report-rope-alibi --keep-models
  posenc demo --quick --checkpoint gemma3-full,falcon-alibi-bias -o /tmp/report   # pick checkpoint samples

Writes OUT/report.md, OUT/report.html (self-contained), OUT/demo.json, the PNG plots, OUT/parity/*.md
(per-model parity tables, ckpt-*.md for the real checkpoints) and OUT/bench/ (benchmark JSON and Markdown).
The real-checkpoint section builds tiny seeded checkpoints of every supported family with transformers
(save_pretrained), exports a layer of each with its weights, validates it against the checkpoint's own
transformers module, optimizes it and builds an engine; it is skipped, with the reason, without transformers.
"""


def _run(args: argparse.Namespace) -> int:
    schemes = tuple(split_names(args.scheme))
    options = DemoOptions(
        output=Path(args.output),
        quick=args.quick,
        schemes=schemes,
        jobs=args.jobs,
        threads=args.threads,
        engine_targets=tuple(args.engine_target or ()),
        keep_models=args.keep_models,
        progress=not args.quiet,
        checkpoints=tuple(split_names(args.checkpoint)) if args.checkpoint else (() if args.no_checkpoints else None),
    )
    resolve_schemes(options.schemes or None)  # unknown names fail before any work
    checkpoint_section(options)  # unknown sample names too
    check_output(args.output, "report folder", folder=True)  # and a report folder that cannot be one
    check_engine_targets(options.engine_targets)  # and targets the engine backend cannot build for
    result = run_demo(options)
    if args.json:
        print((options.output / RESULT_NAME).read_text(), end="")
        return 0
    parity = result.parity_stages()
    passed = sum(1 for p in parity if p.passed)
    checkpoints = result.checkpoints
    print(
        f"{len(result.schemes)} schemes, {passed}/{len(parity)} graphs match eager PyTorch on ONNX Runtime; "
        f"{sum(r.passed for r in checkpoints)}/{len(checkpoints)} checkpoint layers match their own transformers "
        f"module; {result.seconds:.0f} s."
    )
    print(f"report: {Path(args.output) / 'report.html'} and report.md")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``posenc demo`` to the CLI."""
    p = subparsers.add_parser(
        "demo",
        help="run the whole pipeline for every scheme and write a report (no arguments needed)",
        description="Export -> optimize -> validate on ONNX Runtime -> TensorRT engine (when a backend is "
        "installed) -> benchmark, for every registered scheme on an embedded Llama-like attention block; "
        "writes report.md and a self-contained report.html.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add(p, "output", default="report", note="the report folder (default: report)")
    p.add_argument("--quick", action="store_true", help="tiny block, one table mode per scheme, short benchmark")
    add(p, "scheme", repeat=True, note="or comma-separated; default: every registered scheme")
    p.add_argument("--jobs", type=int, default=DemoOptions.jobs, help=f"worker processes (default {DemoOptions.jobs})")
    add(p, "threads", default=DemoOptions.threads, note="of the benchmark; default: all CPUs")
    add(p, "engine_target", repeat=True, note="default: sm89 with TensorRT-RTX, the local GPU with tensorrt")
    p.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="NAME",
        help="sample checkpoints of the real-checkpoint section (repeat or comma-separated; default: every sample, "
        "--quick: a few; `python -m posenc.checkpoints.samples --list`)",
    )
    p.add_argument("--no-checkpoints", action="store_true", help="skip the real-checkpoint section")
    add(p, "keep_models")
    add(p, "quiet")
    add(p, "json", note="what the report shows (OUT/demo.json)")
    p.set_defaults(func=_run)
