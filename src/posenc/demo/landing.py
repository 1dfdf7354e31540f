"""Where a demo run's files land in the report folder: what a previous run wrote is removed first (and only that),
the report is written in a staging folder and moved in whole, and the files a run wrote are listed for the next.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from posenc.artifacts.files import write_text_atomic
from posenc.demo.records import DemoResult
from posenc.errors import ConfigError

RESULT_NAME = "demo.json"
"""The run's record (:class:`~posenc.demo.records.DemoResult` as JSON) in the report folder."""


RESULT_FOLDERS = ("bench", "parity")
"""Sub-folders of the report folder a run fills anew (a previous run's files there are removed)."""
WRITTEN_NAME = ".posenc-demo-files.json"
"""The files of those folders a run wrote, so the next run removes exactly those."""


def clear_previous_results(out: Path) -> None:
    """Remove the files a previous demo run wrote in ``out``'s result folders (listed in :data:`WRITTEN_NAME`),
    before any work; refuse a folder holding files the demo did not write, which it would otherwise delete.

    Raises:
        ConfigError: ``out/bench`` or ``out/parity`` holds a file no demo run recorded.
    """
    listed = out / WRITTEN_NAME
    try:
        written = set(json.loads(listed.read_text(encoding="utf-8"))["files"]) if listed.is_file() else set()
    except (OSError, ValueError, KeyError, TypeError):
        written = set()
    found = [p for name in RESULT_FOLDERS for p in sorted((out / name).rglob("*")) if not p.is_dir()]
    foreign = [p for p in found if p.relative_to(out).as_posix() not in written]
    if foreign:
        raise ConfigError(
            f"{out} holds files the demo did not write ({', '.join(str(p.relative_to(out)) for p in foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}), which its run would replace; choose a new or empty -o folder, "
            f"or move them."
        )
    for path in found:
        path.unlink(missing_ok=True)
    for name in RESULT_FOLDERS:
        for folder in sorted((out / name).glob("**/"), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                folder.rmdir()  # empty now; a folder with anything left in it stays


def record_results(out: Path) -> None:
    """List the files this run left in ``out``'s result folders (:data:`WRITTEN_NAME`)."""
    files = sorted(
        p.relative_to(out).as_posix() for name in RESULT_FOLDERS for p in (out / name).rglob("*") if p.is_file()
    )
    write_text_atomic(out / WRITTEN_NAME, json.dumps({"files": files}, indent=1) + "\n")


REPORT_STAGING = ".posenc-demo-report.tmp"
"""The folder (inside the report folder) where the report is written before it lands."""


def land_report(result: DemoResult, bench_doc: Any, out: Path) -> None:
    """Write ``demo.json``, the report and its figures into a staging folder inside ``out``, then move each file into
    ``out`` (renames need no space). A failure while writing (a full disk) removes the staging folder and leaves
    ``out``'s previous report as it was: no report is half-written."""
    from posenc.demo.report import write_demo_report

    staging = out / REPORT_STAGING
    shutil.rmtree(staging, ignore_errors=True)  # a killed run's
    staging.mkdir()
    try:
        write_text_atomic(staging / RESULT_NAME, json.dumps(result.to_dict(), indent=1) + "\n")
        write_demo_report(result, bench_doc, staging)
        for path in sorted(staging.iterdir()):
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


__all__ = [
    "REPORT_STAGING",
    "RESULT_FOLDERS",
    "RESULT_NAME",
    "WRITTEN_NAME",
    "clear_previous_results",
    "land_report",
    "record_results",
]
