"""``posenc models``: the model types posenc loads checkpoints of, and ``--census`` of every transformers text type.

Imports nothing heavy at registration: ``posenc --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from posenc.cli_args import add, check_output, path_arg, split_names

EPILOG = """\
examples:
  posenc models                                   # model types posenc loads checkpoints of, by family
  posenc models --census -j 2                     # every text model type of transformers -> docs/models.md
  posenc models --census --types llama,phi,gemma3 --cache /tmp/c.json -o /tmp/models.md
  posenc models --census --render                 # docs/models.md again from the cache, running nothing

The census builds a tiny seeded checkpoint of each type (its config class with small sizes; save_pretrained of
the random initialisation, never downloaded), exports one layer of each layer kind with `posenc export --hf-model`
and checks it with `posenc validate --against-hf`, each type in its own process under --timeout and --memory-gb.
Results go to the --cache JSON after every type; a rerun skips the types whose entry is current (same
transformers, torch and posenc sources) unless --refresh.
exit status: 0 done (refused or failing types are results, not errors); 2 bad options."""


def _families(args: argparse.Namespace) -> int:
    from posenc.checkpoints import all_families

    rows = [
        {"family": f.name, "title": f.title, "model_types": list(f.model_types), "layer_types": list(f.layer_types)}
        for f in all_families()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["family"]) for r in rows)
    for row in rows:
        print(f"{row['family'].ljust(width)}  {', '.join(row['model_types'])}  ({row['title']})")
    count = sum(len(r["model_types"]) for r in rows)
    print(f"\n{count} model types in {len(rows)} families. `posenc models --census` tries every transformers type.")
    return 0


def _census(args: argparse.Namespace) -> int:
    from posenc.artifacts.files import write_json_atomic, write_text_atomic
    from posenc.census.report import counts, render
    from posenc.census.run import Limits, load_cache, run_census, select

    cache_path, output = Path(args.cache), Path(args.output)
    check_output(args.output, "census page")
    check_output(args.cache, "census cache")
    types = split_names(args.types) or None
    started = time.monotonic()
    if args.render:
        cache = load_cache(cache_path)
    else:
        progress = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
        limits = Limits(timeout_s=args.timeout, memory_gb=args.memory_gb)
        cache = run_census(
            cache_path, types=types, jobs=args.j, limits=limits, refresh=args.refresh, seed=args.seed, progress=progress
        )
        cache["last_run"] = {"wall_s": round(time.monotonic() - started, 1), "jobs": args.j, "types": types or "all"}
        write_json_atomic(cache_path, cache)
    command = "posenc models --census" + (f" --types {','.join(types)}" if types else "")
    wall = (cache.get("last_run") or {}).get("wall_s") if types is None or args.render else None
    shown = {**cache, "types": select(cache, types)}
    write_text_atomic(output, render(shown, command=command, wall_s=wall))
    summary = counts(shown["types"])
    if args.json:
        print(json.dumps({"counts": summary, "types": shown["types"]}, indent=2, default=str))
    else:
        paths = ", ".join(f"{k} {v}" for k, v in sorted(summary["by_path"].items(), key=lambda kv: -kv[1]))
        print(f"{summary['types']} types: {paths}")
        print(
            f"{summary['positional_passed']} of {summary['positional']} types with attention and positions export "
            f"and match; {summary['passed']} of {summary['types']} in all"
        )
        print(f"wrote {output} and {cache_path} ({time.monotonic() - started:.0f} s)")
    return 0


def _run(args: argparse.Namespace) -> int:
    census_only = [
        flag
        for flag, given in (("--types", args.types), ("--refresh", args.refresh), ("--render", args.render))
        if given
    ]
    if not args.census:
        if census_only:
            from posenc.errors import ConfigError

            raise ConfigError(f"{', '.join(census_only)} belong to --census; add --census.")
        return _families(args)
    return _census(args)


def register(subparsers: Any) -> None:
    """Add the ``models`` subcommand."""
    p = subparsers.add_parser(
        "models",
        help="model types posenc loads checkpoints of; --census: every transformers text type -> docs/models.md",
        description="The checkpoint families posenc loads; with --census, try every text model type of the "
        "installed transformers on a tiny seeded checkpoint and write the table of what exports and matches.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--census", action="store_true", help="run the census (see below)")
    census = p.add_argument_group("the census")
    census.add_argument(
        "--types", action="append", metavar="A,B", help="only these model types (comma-separated, repeatable)"
    )
    census.add_argument("-j", type=int, default=1, metavar="N", help="types run at a time (default 1)")
    census.add_argument("--timeout", type=float, default=300.0, metavar="S", help="seconds per type (default 300)")
    census.add_argument(
        "--memory-gb", type=float, default=6.0, metavar="G", help="address-space limit per type (default 6)"
    )
    census.add_argument(
        "--cache",
        type=path_arg,
        default="docs/models.json",
        metavar="FILE",
        help="results JSON (default docs/models.json)",
    )
    census.add_argument("--refresh", action="store_true", help="rerun types whose cached entry is current too")
    census.add_argument("--render", action="store_true", help="only write the page from the cache")
    add(census, "output", default="docs/models.md", note="the census page (default docs/models.md)")
    add(census, "seed", default=0, note="of every tiny checkpoint; default 0")
    add(census, "quiet", note="no line per finished type on stderr")
    add(p, "json", note="the families, or the census counts and entries")
    p.set_defaults(func=_run)


__all__ = ["register"]
