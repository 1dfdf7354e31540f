"""The census run: every text model type in its own process, under a time and memory limit, results cached.

:func:`run_census` classifies the installed transformers' model types (:mod:`posenc.census.types`), runs
:mod:`posenc.census.worker` for each one not already in the cache with the current fingerprint, ``jobs`` at a
time, and writes the cache after every type. A worker that crashes, runs out of memory or past its time limit is
recorded as such (with whatever it finished), and the census goes on.

The cache is one JSON file (``{"format", "types": {name: entry}, "left_out": {name: reason}}``); an entry is
reused while its ``fingerprint`` — transformers' and torch's versions and a hash of posenc's sources — is the
current one, so a rerun does only what changed or is missing, and a change to posenc reruns everything.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from posenc.artifacts.files import write_json_atomic
from posenc.census.types import LeftOut, ModelType, text_model_types
from posenc.errors import ConfigError, ModelFileError

CACHE_FORMAT = "posenc.census/1"
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_MEMORY_GB = 6.0


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-type limits: wall-clock seconds and address space (GiB) of the worker process."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_gb: float = DEFAULT_MEMORY_GB


def fingerprint() -> str:
    """transformers' and torch's versions and a sha256 of every posenc source file (sorted by path)."""
    import torch
    import transformers

    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return f"transformers {transformers.__version__}, torch {torch.__version__}, posenc {digest.hexdigest()[:16]}"


def load_cache(path: Path) -> dict[str, Any]:
    """The cache at ``path`` (an empty one where there is none)."""
    if not path.exists():
        return {"format": CACHE_FORMAT, "types": {}, "left_out": {}}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"census cache {path} is unreadable ({exc}); delete it to start over.") from None
    if data.get("format") != CACHE_FORMAT:
        raise ModelFileError(f"{path} is not a census cache ({CACHE_FORMAT}); give another --cache or delete it.")
    return dict(data)


def _limit_memory(gigabytes: float) -> Callable[[], None]:
    def apply() -> None:
        limit = int(gigabytes * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def run_worker(info: ModelType, limits: Limits, *, seed: int = 0, keep: Path | None = None) -> dict[str, Any]:
    """One worker process for ``info`` (see :mod:`posenc.census.worker`); its result, or a record of how it died."""
    workdir = Path(tempfile.mkdtemp(prefix=f"posenc-census-{info.name}-"))
    out = workdir / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    command = [
        sys.executable,
        "-m",
        "posenc.census.worker",
        json.dumps(dataclasses.asdict(info)),
        "--workdir",
        str(workdir),
        "--out",
        str(out),
        "--seed",
        str(seed),
    ]
    started = time.monotonic()
    with open(workdir / "log.txt", "wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: a time-out stops it and anything it started
            preexec_fn=_limit_memory(limits.memory_gb),  # setrlimit in the child, before exec
        )
        try:
            status = process.wait(timeout=limits.timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            status = process.wait()
            timed_out = True
    result: dict[str, Any] = {}
    if out.exists():
        try:
            result = json.loads(out.read_text())
        except json.JSONDecodeError:
            result = {}
    result = {**dataclasses.asdict(info), "layers": [], **result}
    log_tail = (workdir / "log.txt").read_text(errors="replace").strip().splitlines()[-3:]
    if timed_out:
        result.update(status="timeout", reason=f"stopped after {limits.timeout_s:.0f} s in stage {result.get('stage')}")
    elif result.get("status") != "ok" and result.get("status") != "no-checkpoint":
        cause = f"exit status {status}" if status >= 0 else f"signal {-status}"
        memory = " (memory limit?)" if "MemoryError" in " ".join(log_tail) or status == -signal.SIGKILL else ""
        result.update(
            status="crashed",
            reason=f"worker died in stage {result.get('stage')}: {cause}{memory}; {' | '.join(log_tail)[-300:]}",
        )
    result["seconds"] = round(time.monotonic() - started, 2)
    if keep is None:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        shutil.move(str(workdir), keep / info.name)
    return result


def run_census(
    cache_path: Path,
    *,
    types: Iterable[str] | None = None,
    jobs: int = 1,
    limits: Limits = Limits(),
    refresh: bool = False,
    seed: int = 0,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Run the census into the cache at ``cache_path`` and return the cache.

    Args:
        cache_path: the JSON cache (created if missing).
        types: only these model types (each must be a text model type of transformers).
        jobs: workers at a time.
        limits: per-type time and memory limits.
        refresh: rerun types whose cached entry is current too.
        seed: of every tiny checkpoint.
        progress: called with one line per finished type.

    Raises:
        ConfigError: an unknown or non-text type in ``types``; ``jobs`` below 1.
    """
    if jobs < 1:
        raise ConfigError(f"-j takes a positive number of parallel types, got {jobs}.")
    wanted = sorted(set(types)) if types is not None else None
    found, left = text_model_types(wanted)
    _check_requested(wanted, found, left)
    cache = load_cache(cache_path)
    current = fingerprint()
    cache["fingerprint"] = current
    if wanted is None:  # a full run: the cache holds this transformers' types and no others
        cache["left_out"] = {entry.name: entry.reason for entry in left}
        cache["types"] = {name: entry for name, entry in cache["types"].items() if name in {t.name for t in found}}
    todo = [t for t in found if refresh or cache["types"].get(t.name, {}).get("fingerprint") != current]
    progress(f"{len(found)} text model types, {len(todo)} to run ({len(found) - len(todo)} cached), {jobs} at a time")
    lock = threading.Lock()
    started = time.monotonic()

    def one(info: ModelType) -> None:
        result = run_worker(info, limits, seed=seed)
        result["fingerprint"] = current
        with lock:
            cache["types"][info.name] = result
            write_json_atomic(cache_path, cache)
            done = sum(1 for t in todo if cache["types"].get(t.name, {}).get("fingerprint") == current)
            paths = ",".join(sorted({str(k.get("path")) for k in result.get("layers", []) if k.get("attention")}))
            progress(
                f"[{done}/{len(todo)} {time.monotonic() - started:.0f}s] {info.name}: {result.get('status')} "
                f"{result.get('scheme', '-')} {paths or result.get('reason', '')[:80]} ({result['seconds']:.0f}s)"
            )

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in concurrent.futures.as_completed([pool.submit(one, info) for info in todo]):
            future.result()
    write_json_atomic(cache_path, cache)
    return cache


def _check_requested(wanted: list[str] | None, found: list[ModelType], left: list[LeftOut]) -> None:
    if wanted is None:
        return
    known = {t.name for t in found}
    reasons = {entry.name: entry.reason for entry in left}
    bad = [
        f"{name} ({reasons.get(name, 'transformers does not know this model_type')})"
        for name in wanted
        if name not in known
    ]
    if bad:
        raise ConfigError(
            f"not text model types of this transformers: {'; '.join(bad)}. `posenc models --census` "
            f"without --types runs every text model type."
        )


def select(cache: Mapping[str, Any], types: Iterable[str] | None) -> dict[str, Any]:
    """The cache's entries of ``types`` (all where None)."""
    entries: dict[str, Any] = cache.get("types", {})
    return dict(entries) if types is None else {k: v for k, v in entries.items() if k in set(types)}


__all__ = ["CACHE_FORMAT", "Limits", "fingerprint", "load_cache", "run_census", "run_worker", "select"]
