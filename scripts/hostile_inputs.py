"""Try posenc as a hostile user would, and count what it handled cleanly.

Every subcommand (export, optimize, inspect, build, validate, sweep, bench, demo) and the Python API get bad paths
(missing, empty, folders, devices, FIFOs, files under files), impossible sizes, parameters outside their domain,
tampered manifests, weights and external data, models whose files lead out of their folder, killed and concurrent
writers, and position ids outside a graph's table in a plain ONNX Runtime session.

A try is *handled cleanly* when posenc refuses it with exit status 2 (a :class:`posenc.PosencError` in the API),
one line that names the problem (the words the try expects), touches nothing it should not, and leaves no file
behind; or, for graphs fed bad positions, raises or returns NaN. Otherwise it counts in one failure class:

- ``crash``: a traceback (exit 3), an exception that is not a PosencError, or a hang;
- ``files``: files left behind (staging, half-written or mismatched artifacts);
- ``security``: a file outside the model's folder read, a device or FIFO replaced, looser permissions;
- ``wrong numbers``: finite outputs for positions outside the table, or an accepted configuration with non-finite
  outputs;
- ``message``: the wrong exit status, or a message that does not say what was wrong.

Usage::

    PYTHONPATH=src python scripts/hostile_inputs.py [--only GROUP] [--json OUT.json] [--keep DIR]

It prints one line per failing try and the figures: tries, handled cleanly, and failures per class. Runs as any
user; as root it also tries a character device as output (made with mknod in its scratch folder). About 3 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

CLASSES = ("crash", "files", "security", "wrong numbers", "message")
TIMEOUT = 120


class Hang(BaseException):
    """Raised by the alarm when a try runs past its time (a BaseException: posenc's handlers do not catch it)."""


@dataclasses.dataclass
class Result:
    """What one try did."""

    code: int | None = None  # CLI exit status
    out: str = ""
    err: str = ""
    error: BaseException | None = None  # API: the exception raised
    value: Any = None  # API: what it returned
    hung: bool = False
    seconds: float = 0.0


@dataclasses.dataclass
class Try:
    """One hostile try: ``run(ws)`` acts in the scratch folder ``ws`` and returns ``None`` (clean) or a failure
    ``(class, reason)``."""

    name: str
    group: str
    run: Callable[[Path], tuple[str, str] | None]


@contextlib.contextmanager
def alarm(seconds: int) -> Iterator[None]:
    def fire(signum: int, frame: Any) -> None:
        raise Hang()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def cli(argv: list[str], timeout: int = TIMEOUT) -> Result:
    """Run ``posenc ARGV`` in this process (stdout and stderr captured)."""
    from posenc.cli import main

    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    result = Result()
    try:
        with alarm(timeout), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            result.code = main([str(a) for a in argv])
    except Hang:
        result.hung = True
    except SystemExit as exc:
        result.code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # anything escaping main() is a crash
        result.error = exc
    result.out, result.err = out.getvalue(), err.getvalue()
    result.seconds = time.perf_counter() - started
    return result


def api(fn: Callable[[], Any], timeout: int = TIMEOUT) -> Result:
    """Call ``fn`` (the Python API) and keep what it returned or raised."""
    result = Result()
    started = time.perf_counter()
    try:
        with alarm(timeout), contextlib.redirect_stderr(io.StringIO()):
            result.value = fn()
    except Hang:
        result.hung = True
    except BaseException as exc:  # the API call may raise anything
        result.error = exc
    result.seconds = time.perf_counter() - started
    return result


# --------------------------------------------------------------------------------------------------
# Judging
# --------------------------------------------------------------------------------------------------


def snapshot(folder: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every entry below ``folder``: (type bits, permission bits, bytes of small regular files)."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            info = path.lstat()
            data = None
            if stat.S_ISREG(info.st_mode) and info.st_size < (1 << 22):
                data = path.read_bytes()
            found[str(path.relative_to(folder))] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), data)
    return found


def hidden_leftovers(before: dict, after: dict) -> list[str]:
    return [name for name in after if name not in before and Path(name).name.startswith(".")]


def judge_refusal(result: Result, words: tuple[str, ...] = (), fifo: bool = False) -> tuple[str, str] | None:
    """A clean refusal: exit 2 (API: a PosencError) with one line naming the problem (``words``, any of them)."""
    from posenc.errors import PosencError

    if result.hung:
        return ("security" if fifo else "crash", "hung")
    if result.error is not None and not isinstance(result.error, PosencError):
        return "crash", f"{type(result.error).__name__}: {str(result.error)[:120]}"
    if result.code == 3 or "Traceback" in result.err:
        return "crash", f"traceback: {result.err.strip().splitlines()[-1][:140] if result.err.strip() else ''}"
    if result.code is not None and result.code != 2:
        return "message", f"exit {result.code} (expected 2): {(result.err or result.out).strip()[:140]}"
    if result.error is None and result.code is None:
        return "message", "accepted"
    text = str(result.error) if result.error is not None else result.err
    if words and not any(w.lower() in text.lower() for w in words):
        return "message", f"message does not say {words}: {text.strip()[:160]}"
    return None


def refuse(
    argv_or_fn: list[str] | Callable[[], Any],
    words: tuple[str, ...] = (),
    *,
    fifo: bool = False,
    protected: tuple[Path, ...] = (),
    folder: Path | None = None,
    timeout: int = TIMEOUT,
) -> tuple[str, str] | None:
    """Run a CLI try (a list) or an API try (a callable) that must be refused, and judge it (files too)."""
    kinds = {p: (p.lstat().st_mode if p.exists() or p.is_symlink() else None) for p in protected}
    before = snapshot(folder) if folder is not None else {}
    result = cli(argv_or_fn, timeout) if isinstance(argv_or_fn, list) else api(argv_or_fn, timeout)
    for path, mode in kinds.items():
        now = path.lstat().st_mode if path.exists() or path.is_symlink() else None
        if mode is not None and (now is None or stat.S_IFMT(now) != stat.S_IFMT(mode)):
            return "security", f"{path.name} was replaced or removed"
    verdict = judge_refusal(result, words, fifo)
    if verdict is not None:
        return verdict
    if folder is not None:
        after = snapshot(folder)
        hidden = hidden_leftovers(before, after)
        new = [n for n in after if n not in before and not Path(n).name.startswith(".")]
        if hidden or new:
            return "files", f"left {sorted(hidden + new)[:4]}"
    return None


# --------------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------------

TABLE = 64
"""Rows of the fixtures' precomputed tables."""


@dataclasses.dataclass
class Fixtures:
    root: Path
    models: dict[str, Path]
    engine: Path | None
    checkpoint: Path | None

    def copy(self, name: str, into: Path) -> Path:
        """The fixture model ``name`` with its manifest and weights, copied into ``into``."""
        from posenc.export import manifest_path_for, weights_path_for

        source = self.models[name]
        into.mkdir(parents=True, exist_ok=True)
        for path in (source, manifest_path_for(source), weights_path_for(source)):
            if path.exists():
                shutil.copy2(path, into / path.name)
        return into / source.name


def make_fixtures(root: Path) -> Fixtures:
    from posenc.config import AttentionConfig
    from posenc.export import export_scheme
    from posenc.graphs import optimize_file

    config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=TABLE)
    models = {}
    for scheme, unit in (("rope", "op"), ("rope", "block"), ("alibi", "op"), ("learned", "op")):
        path = root / f"{scheme}_{unit}" / f"{scheme}_{unit}.onnx"
        models[f"{scheme}_{unit}"] = export_scheme(scheme, path, unit=unit, config=config, max_positions=TABLE).path
    trt = root / "rope_trt" / "rope_op.trt.onnx"
    trt.parent.mkdir(parents=True, exist_ok=True)
    optimize_file(models["rope_op"], trt, "trt")
    models["rope_trt"] = trt
    engine = None
    with contextlib.suppress(Exception):
        from posenc.engine import build_engine

        engine = build_engine(trt, root / "engine" / "rope.engine", targets=["sm89"]).path
    checkpoint = None
    with contextlib.suppress(Exception):
        from posenc.checkpoints.samples import get_sample

        checkpoint = get_sample("llama").build(root / "ckpt" / "llama", shard=None)
    return Fixtures(root, models, engine, checkpoint)


def special(folder: Path, kind: str) -> Path:
    """A bad path of ``kind`` in ``folder``: missing, empty, dir, zero (empty file), random, truncated, fifo, device."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"bad_{kind}.onnx"
    if kind == "dir":
        path.mkdir()
    elif kind == "zero":
        path.write_bytes(b"")
    elif kind == "random":
        path.write_bytes(random.Random(7).randbytes(4096))
    elif kind == "proto":  # bytes protobuf reads as an empty model (TensorRT's parser takes them too)
        path.write_bytes(b"\x08\x07")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        if os.geteuid() == 0:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a null device of our own
        else:
            return Path(os.devnull)
    return path


# --------------------------------------------------------------------------------------------------
# The tries
# --------------------------------------------------------------------------------------------------

INPUT_KINDS = ("missing", "empty", "dir", "zero", "random", "proto", "truncated", "fifo", "device")
INPUT_WORDS = {
    "missing": ("does not exist",),
    "empty": ("empty",),
    "dir": ("folder", "directory"),
    "zero": ("empty", "0 bytes"),
    "random": ("not a readable onnx", "not a valid onnx", "corrupt"),
    "proto": ("no onnx graph", "not a valid onnx", "not a readable onnx"),
    "truncated": ("not a readable onnx", "truncated", "corrupt", "does not match"),
    "fifo": ("fifo", "not a regular file"),
    "device": ("device", "not a regular file"),
}


def input_tries(fx: Fixtures) -> list[Try]:
    tries = []
    commands: dict[str, Callable[[Path, Path], list[str]]] = {
        "optimize": lambda m, ws: ["optimize", m, "--target", "trt", "-o", ws / "out.onnx"],
        "inspect": lambda m, ws: ["inspect", m, "--no-tensorrt"],
        "build": lambda m, ws: ["build", m, "--engine-target", "sm89", "-o", ws / "out.engine"],
        "validate": lambda m, ws: ["validate", m],
    }
    for command, argv in commands.items():
        for kind in INPUT_KINDS:

            def run(ws: Path, command: str = command, kind: str = kind, argv: Callable = argv) -> Any:
                if kind == "truncated":
                    model = fx.copy("rope_op", ws)
                    model.write_bytes(model.read_bytes()[:1000])
                elif kind == "empty":
                    model = Path("")
                else:
                    model = special(ws, kind)
                    if kind == "missing":
                        model = ws / "nothing.onnx"
                args = argv(model, ws)
                if kind == "empty":
                    args[args.index(model)] = ""
                return refuse(args, INPUT_WORDS[kind], fifo=kind in ("fifo", "device"), protected=(model,), folder=ws)

            tries.append(Try(f"{command} <{kind} model>", "input paths", run))
    return tries


def checkpoint_tries(fx: Fixtures) -> list[Try]:
    def hf_model(setup: Callable[[Path], Path | str], words: tuple[str, ...]) -> Callable[[Path], Any]:
        def run(ws: Path) -> Any:
            target = setup(ws)
            return refuse(["export", "--hf-model", target, "-o", ws / "out" / "m.onnx"], words, folder=ws)

        return run

    def ckpt_copy(ws: Path) -> Path:
        if fx.checkpoint is None:
            raise RuntimeError("no transformers: no checkpoint fixture")
        return Path(shutil.copytree(fx.checkpoint, ws / "ckpt"))

    def fifo_config(ws: Path) -> Path:
        folder = ckpt_copy(ws)
        (folder / "config.json").unlink()
        os.mkfifo(folder / "config.json")
        return folder

    def weights_link_out(ws: Path) -> Path:
        folder = ckpt_copy(ws)
        outside = ws / "outside.safetensors"
        shutil.move(folder / "model.safetensors", outside)
        (folder / "model.safetensors").symlink_to(outside)
        return folder

    def index_out(ws: Path) -> Path:
        folder = ckpt_copy(ws)
        shutil.move(folder / "model.safetensors", ws / "shard.safetensors")
        from safetensors import safe_open

        with safe_open(str(ws / "shard.safetensors"), "pt") as handle:
            keys = list(handle.keys())
        index = {"metadata": {}, "weight_map": dict.fromkeys(keys, "../shard.safetensors")}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        return folder

    def weights_fifo(ws: Path) -> Path:
        folder = ckpt_copy(ws)
        (folder / "model.safetensors").unlink()
        os.mkfifo(folder / "model.safetensors")
        return folder

    def no_weights(ws: Path) -> Path:
        folder = ckpt_copy(ws)
        (folder / "model.safetensors").unlink()
        return folder

    def empty_dir(ws: Path) -> Path:
        (ws / "empty").mkdir()
        return ws / "empty"

    def a_file(ws: Path) -> Path:
        (ws / "f").write_text("x")
        return ws / "f"

    tries = [
        Try("export --hf-model <missing>", "checkpoint paths", hf_model(lambda ws: ws / "none", ("does not exist",))),
        Try("export --hf-model ''", "checkpoint paths", hf_model(lambda ws: "", ("empty",))),
        Try("export --hf-model org/name", "checkpoint paths", hf_model(lambda ws: "meta-llama/x", ("hub id",))),
        Try("export --hf-model <file>", "checkpoint paths", hf_model(a_file, ("not a checkpoint folder", "file"))),
        Try("export --hf-model <empty dir>", "checkpoint paths", hf_model(empty_dir, ("config.json",))),
        Try("export --hf-model <no weights>", "checkpoint paths", hf_model(no_weights, ("no weights",))),
        Try("export --hf-model <config FIFO>", "checkpoint paths", hf_model(fifo_config, ("fifo",))),
        Try("export --hf-model <weights FIFO>", "checkpoint paths", hf_model(weights_fifo, ("fifo",))),
        Try("export --hf-model <weights link out>", "checkpoint paths", hf_model(weights_link_out, ("out of",))),
        Try("export --hf-model <index ../shard>", "checkpoint paths", hf_model(index_out, ("outside",))),
    ]

    def hf_config(setup: Callable[[Path], Path | str], words: tuple[str, ...]) -> Callable[[Path], Any]:
        def run(ws: Path) -> Any:
            return refuse(["export", "--hf-config", setup(ws), "-o", ws / "out.onnx"], words, folder=ws)

        return run

    def write(name: str, data: bytes) -> Callable[[Path], Path]:
        def make(ws: Path) -> Path:
            (ws / name).write_bytes(data)
            return ws / name

        return make

    def fifo(ws: Path) -> Path:
        os.mkfifo(ws / "config.json")
        return ws / "config.json"

    tries += [
        Try("export --hf-config <missing>", "checkpoint paths", hf_config(lambda ws: ws / "c.json", ("not exist",))),
        Try("export --hf-config ''", "checkpoint paths", hf_config(lambda ws: "", ("empty",))),
        Try("export --hf-config <dir>", "checkpoint paths", hf_config(empty_dir, ("not exist", "config"))),
        Try("export --hf-config <FIFO>", "checkpoint paths", hf_config(fifo, ("fifo",))),
        Try("export --hf-config <random>", "checkpoint paths", hf_config(write("c.json", b"\xff\xfe\x00"), ("json",))),
        Try("export --hf-config <list>", "checkpoint paths", hf_config(write("c.json", b"[1, 2]"), ("object",))),
    ]

    def against(setup: Callable[[Path], Path | str], words: tuple[str, ...]) -> Callable[[Path], Any]:
        def run(ws: Path) -> Any:
            model = fx.copy("rope_op", ws / "m")
            return refuse(["validate", model, "--against-hf", setup(ws)], words, folder=ws)

        return run

    tries += [
        Try("validate --against-hf <missing>", "checkpoint paths", against(lambda ws: ws / "none", ("not exist",))),
        Try("validate --against-hf <file>", "checkpoint paths", against(a_file, ("checkpoint",))),
        Try("validate --against-hf <FIFO dir>", "checkpoint paths", against(fifo, ("checkpoint", "fifo"))),
    ]

    def engine_try(setup: Callable[[Path], Path], words: tuple[str, ...]) -> Callable[[Path], Any]:
        def run(ws: Path) -> Any:
            model = fx.copy("rope_trt", ws / "m")
            return refuse(["validate", model, "--engine", setup(ws)], words, fifo=True, folder=ws)

        return run

    tries += [
        Try("validate --engine <missing>", "input paths", engine_try(lambda ws: ws / "x.engine", ("not exist",))),
        Try("validate --engine <dir>", "input paths", engine_try(lambda ws: special(ws, "dir"), ("folder",))),
        Try("validate --engine <FIFO>", "input paths", engine_try(lambda ws: special(ws, "fifo"), ("fifo",))),
        Try(
            "validate --engine <random>",
            "input paths",
            engine_try(lambda ws: special(ws, "random"), ("gpu", "tensorrt")),
        ),
    ]
    return tries


OUTPUT_KINDS = ("empty", "dir", "device", "fifo", "under-file")


def output_tries(fx: Fixtures) -> list[Try]:
    """Every writer against outputs it cannot write: refused before any work, nothing replaced or left."""

    def bad_output(ws: Path, kind: str, folder_output: bool) -> Path | str:
        if kind == "empty":
            return ""
        if kind == "dir":
            if folder_output:  # a folder output given a regular file
                (ws / "file").write_text("keep")
                return ws / "file"
            return special(ws, "dir")
        if kind == "under-file":
            (ws / "file").write_text("keep")
            return ws / "file" / "below"
        return special(ws, kind)

    writers: dict[str, tuple[bool, Callable[[Path, Any], list[str]]]] = {
        "export -o": (False, lambda ws, o: ["export", "-s", "rope", "--unit", "op", "-o", o]),
        "optimize -o": (False, lambda ws, o: ["optimize", fx.copy("rope_op", ws / "m"), "--target", "trt", "-o", o]),
        "build -o": (False, lambda ws, o: ["build", fx.copy("rope_trt", ws / "m"), "--engine-target", "sm89", "-o", o]),
        "validate --report": (False, lambda ws, o: ["validate", fx.copy("rope_op", ws / "m"), "--report", o]),
        "validate --json-out": (False, lambda ws, o: ["validate", fx.copy("rope_op", ws / "m"), "--json-out", o]),
        "sweep -o": (
            True,  # a folder or a new prefix
            lambda ws, o: [
                "sweep",
                "-s",
                "rope",
                "--dtype",
                "fp32",
                "--last-position",
                "64",
                "--per-bucket",
                "2",
                "--table-mode",
                "precomputed",
                "--no-fp16-tables",
                "-o",
                o,
            ],
        ),
        "bench -o": (
            True,
            lambda ws, o: [
                "bench",
                "-s",
                "rope",
                "--unit",
                "op",
                "--shape",
                "1,4",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "--copy-mib",
                "1",
                "--no-plots",
                "--backend",
                "torch",
                "--quiet",
                "-o",
                o,
            ],
        ),
        "demo -o": (True, lambda ws, o: ["demo", "--quick", "-s", "rope", "--no-checkpoints", "--quiet", "-o", o]),
    }
    tries = []
    for writer, (folder_output, argv) in writers.items():
        for kind in OUTPUT_KINDS:

            def run(ws: Path, argv: Callable = argv, kind: str = kind, folder_output: bool = folder_output) -> Any:
                output = bad_output(ws, kind, folder_output)
                args = argv(ws, output)
                protected = (Path(output),) if kind in ("device", "fifo", "dir") and output else ()
                words = {
                    "empty": ("empty",),
                    "dir": ("folder", "directory", "regular file"),
                    "device": ("device",),
                    "fifo": ("fifo",),
                    "under-file": ("not a folder", "not a directory"),
                }[kind]
                return refuse(args, words, protected=protected, folder=ws, timeout=300)

            tries.append(Try(f"{writer} <{kind}>", "output paths", run))
    return tries


def number_tries(fx: Fixtures) -> list[Try]:
    """Sizes and parameter values outside their domain, on the command line."""

    def on(argv: Callable[[Path], list[str]], words: tuple[str, ...]) -> Callable[[Path], Any]:
        return lambda ws: refuse(argv(ws), words, folder=ws, timeout=300)

    def export(*extra: str) -> Callable[[Path], list[str]]:
        return lambda ws: ["export", *extra, "-o", ws / "m.onnx"]

    cases: list[tuple[str, Callable[[Path], list[str]], tuple[str, ...]]] = [
        ("export --max-positions 100000000000", export("-s", "rope", "--max-positions", "100000000000"), ("bytes",)),
        ("export --max-positions 0", export("-s", "rope", "--max-positions", "0"), ("max_positions",)),
        ("export --max-positions -1", export("-s", "rope", "--max-positions", "-1"), ("max_positions",)),
        (
            "export -s learned --max-positions 10**9",
            export("-s", "learned", "--max-positions", "1000000000"),
            ("bytes",),
        ),
        ("export --hidden-size 4000000000", export("-s", "rope", "--hidden-size", "4000000000"), ("bytes",)),
        ("export --hidden-size 0", export("-s", "rope", "--hidden-size", "0"), ("hidden_size",)),
        ("export --hidden-size -5", export("-s", "rope", "--hidden-size", "-5"), ("hidden_size",)),
        ("export --num-heads 0", export("-s", "rope", "--num-heads", "0"), ("num_heads",)),
        ("export --num-heads 7", export("-s", "rope", "--num-heads", "7"), ("divisible",)),
        ("export --num-kv-heads 3", export("-s", "rope", "--num-kv-heads", "3"), ("divisible",)),
        ("export --head-dim 0", export("-s", "rope", "--head-dim", "0"), ("head_dim",)),
        ("export --head-dim 7 (odd rotary)", export("-s", "rope", "--head-dim", "7"), ("even", "rotary")),
        ("export --max-position-embeddings 0", export("-s", "rope", "--max-position-embeddings", "0"), ("positive",)),
        ("export --opset 99", export("-s", "rope", "--opset", "99"), ("opset",)),
        ("export --seed -1", export("-s", "rope", "--seed", "-1"), ("seed",)),
        ("export --param factor=abc", export("-s", "rope_linear", "--param", "factor=abc"), ("factor",)),
        ("export --param factor=-1", export("-s", "rope_linear", "--param", "factor=-1"), ("factor",)),
        ("export --param =x", export("-s", "rope", "--param", "=x"), ("key=value",)),
        ("export --unit bogus", export("-s", "rope", "--unit", "bogus"), ("unit",)),
        ("export --dtype fp8", export("-s", "rope", "--dtype", "fp8"), ("dtype",)),
        ("export -s learned --table-mode dynamic", export("-s", "learned", "--table-mode", "dynamic"), ("table mode",)),
        ("export -s bogus", export("-s", "bogus"), ("unknown scheme",)),
        (
            "optimize --fold-limit -1",
            lambda ws: [
                "optimize",
                fx.copy("rope_op", ws / "m"),
                "--target",
                "trt",
                "--fold-limit",
                "-1",
                "-o",
                ws / "o.onnx",
            ],
            ("fold_limit",),
        ),
        (
            "optimize --target bogus",
            lambda ws: ["optimize", fx.copy("rope_op", ws / "m"), "--target", "x"],
            ("target",),
        ),
        (
            "optimize --rope bogus",
            lambda ws: ["optimize", fx.copy("rope_op", ws / "m"), "--target", "trt", "--rope", "x"],
            ("rope",),
        ),
        (
            "build --workspace-mib -1",
            lambda ws: ["build", fx.copy("rope_trt", ws / "m"), "--workspace-mib", "-1", "-o", ws / "e.engine"],
            ("workspace",),
        ),
        (
            "build --workspace-mib 0",
            lambda ws: ["build", fx.copy("rope_trt", ws / "m"), "--workspace-mib", "0", "-o", ws / "e.engine"],
            ("workspace",),
        ),
        (
            "build --engine-target sm999",
            lambda ws: ["build", fx.copy("rope_trt", ws / "m"), "--engine-target", "sm999", "-o", ws / "e.engine"],
            ("sm999",),
        ),
        (
            "build --engine-target banana",
            lambda ws: ["build", fx.copy("rope_trt", ws / "m"), "--engine-target", "banana", "-o", ws / "e.engine"],
            ("compute capability",),
        ),
        (
            "build --profile seq=5:1:2",
            lambda ws: ["build", fx.copy("rope_trt", ws / "m"), "--profile", "seq=5:1:2", "-o", ws / "e.engine"],
            ("seq",),
        ),
        (
            "build --profile bogus",
            lambda ws: ["build", fx.copy("rope_trt", ws / "m"), "--profile", "bogus", "-o", ws / "e.engine"],
            ("profile", "name=min"),
        ),
        ("validate --shape 0,1", lambda ws: ["validate", fx.copy("rope_op", ws / "m"), "--shape", "0,1"], ("batch",)),
        (
            "validate --shape 100000,100000",
            lambda ws: ["validate", fx.copy("rope_op", ws / "m"), "--shape", "100000,100000"],
            ("bytes", "table"),
        ),
        (
            "validate --shape 1,1,-3",
            lambda ws: ["validate", fx.copy("rope_op", ws / "m"), "--shape", "1,1,-3"],
            ("past", "shape"),
        ),
        (
            "validate --shape 1,100 (past the table)",
            lambda ws: ["validate", fx.copy("rope_op", ws / "m"), "--shape", "1,100"],
            ("table",),
        ),
        ("validate --shape x", lambda ws: ["validate", fx.copy("rope_op", ws / "m"), "--shape", "x"], ("shape",)),
        (
            "validate --provider cuda",
            lambda ws: ["validate", fx.copy("rope_op", ws / "m"), "--provider", "cuda"],
            ("cuda",),
        ),
        (
            "sweep --last-position -5",
            lambda ws: ["sweep", "-s", "rope", "--last-position", "-5", "-o", ws / "s"],
            ("last-position", "max_position"),
        ),
        (
            "sweep --max-position -5",
            lambda ws: ["sweep", "-s", "rope", "--max-position", "-5", "-o", ws / "s"],
            ("last-position", "max_position"),
        ),
        (
            "sweep --per-bucket 0",
            lambda ws: ["sweep", "-s", "rope", "--per-bucket", "0", "-o", ws / "s"],
            ("per_bucket",),
        ),
        (
            "sweep --per-bucket 10**9",
            lambda ws: ["sweep", "-s", "rope", "--per-bucket", "1000000000", "-o", ws / "s"],
            ("bytes",),
        ),
        ("sweep --dtype bf16", lambda ws: ["sweep", "-s", "rope", "--dtype", "bf16", "-o", ws / "s"], ("bf16",)),
        ("sweep -s bogus", lambda ws: ["sweep", "-s", "bogus", "-o", ws / "s"], ("unknown scheme",)),
    ]
    bench = ["bench", "-s", "rope", "--unit", "op", "--backend", "torch", "--no-plots", "--quiet"]
    for flag, value, words in (
        ("--repeats", "0", ("repeats",)),
        ("--warmup", "-1", ("warmup",)),
        ("--max-seconds", "-1", ("max_seconds",)),
        ("--max-seconds", "nan", ("max_seconds",)),
        ("--copy-mib", "0", ("copy_mib",)),
        ("--copy-mib", "100000000", ("bytes",)),
        ("--threads", "0", ("threads",)),
        ("--shape", "100000,100000", ("exceeds", "smaller")),  # bench caps batch * positions before memory
        ("--unit", "bogus", ("unit",)),
        ("-s", "bogus", ("unknown scheme",)),
    ):
        cases.append((f"bench {flag} {value}", lambda ws, f=flag, v=value: [*bench, f, v, "-o", ws / "b"], words))
    demo = ["demo", "--quick", "-s", "rope", "--no-checkpoints", "--quiet"]
    for flag, value, words in (
        ("--engine-target", "sm999", ("sm999",)),
        ("--jobs", "0", ("jobs",)),
        ("--threads", "0", ("threads",)),
        ("-s", "bogus", ("unknown scheme",)),
        ("--checkpoint", "bogus", ("bogus",)),
    ):
        cases.append((f"demo {flag} {value}", lambda ws, f=flag, v=value: [*demo, f, v, "-o", ws / "r"], words))
    return [Try(name, "sizes and domains", on(argv, words)) for name, argv, words in cases]


def parameter_tries() -> list[Try]:
    """Parameters at the edge of (or outside) their domain: refused, or accepted with finite outputs."""
    import torch

    cases: list[tuple[str, str, dict[str, Any], str]] = [
        ("rope", "rope_theta=0", {"rope_theta": 0}, "fp32"),
        ("rope", "rope_theta=-1", {"rope_theta": -1}, "fp32"),
        ("rope", "rope_theta=1", {"rope_theta": 1}, "fp32"),
        ("rope", "rope_theta=nan", {"rope_theta": "nan"}, "fp32"),
        ("rope", "rope_theta=inf", {"rope_theta": "inf"}, "fp32"),
        ("rope", "rope_theta=1e308", {"rope_theta": 1e308}, "fp32"),
        ("rope", "partial_rotary_factor=0", {"partial_rotary_factor": 0.0}, "fp32"),
        ("rope", "partial_rotary_factor=1.5", {"partial_rotary_factor": 1.5}, "fp32"),
        ("rope", "layout=bogus", {"layout": "bogus"}, "fp32"),
        ("rope_linear", "factor=0", {"factor": 0}, "fp32"),
        ("rope_linear", "factor=1e-300", {"factor": 1e-300}, "fp32"),
        ("rope_dynamic", "factor=0", {"factor": 0}, "fp32"),
        ("rope_yarn", "rope_theta=1", {"rope_theta": 1.0}, "fp32"),
        ("rope_yarn", "beta_fast<beta_slow", {"beta_fast": 1.0, "beta_slow": 32.0}, "fp32"),
        ("rope_yarn", "original_max_position_embeddings=0", {"original_max_position_embeddings": 0}, "fp32"),
        ("rope_yarn", "factor=1e300", {"factor": 1e300}, "fp32"),
        ("rope_longrope", "attention_factor=500000 fp16", {"attention_factor": 500000.0}, "fp16"),
        ("rope_longrope", "short_factor wrong length", {"short_factor": [1.0, 2.0]}, "fp32"),
        ("rope_llama3", "low_freq_factor>high_freq_factor", {"low_freq_factor": 8.0, "high_freq_factor": 1.0}, "fp32"),
        ("rope_llama3", "low_freq_factor=high_freq_factor", {"low_freq_factor": 2.0, "high_freq_factor": 2.0}, "fp32"),
        ("rope_xpos", "scale_base=0", {"scale_base": 0}, "fp32"),
        ("rope_xpos", "scale_base=1e-6", {"scale_base": 1e-6}, "fp32"),
        ("alibi", "alibi_bias_max=0", {"alibi_bias_max": 0}, "fp32"),
        ("alibi", "alibi_bias_max=1e6", {"alibi_bias_max": 1e6}, "fp32"),
        ("t5", "num_buckets=0", {"num_buckets": 0}, "fp32"),
        ("t5", "num_buckets=1", {"num_buckets": 1}, "fp32"),
        ("t5", "max_distance=0", {"max_distance": 0}, "fp32"),
        ("deberta", "position_buckets=0", {"position_buckets": 0}, "fp32"),
        ("sinusoidal", "base=0", {"base": 0}, "fp32"),
        ("rope", "rope_theta=1e-30 fp16", {"rope_theta": 1e-30}, "fp16"),
    ]
    tries = []
    for scheme, label, params, dtype in cases:

        def run(ws: Path, scheme: str = scheme, params: dict = params, dtype: str = dtype) -> Any:
            from posenc import AttentionBlock, AttentionConfig
            from posenc.errors import PosencError
            from posenc.export import FeedShape, export_scheme, make_feed, run_onnx
            from posenc.schemes import get_spec

            config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=TABLE)

            def go() -> Any:
                spec = get_spec(scheme)
                known = {k: v for k, v in params.items() if k in spec.param_names()}
                if len(known) != len(params):
                    raise AssertionError(f"{scheme} has no parameter {sorted(set(params) - set(known))}")
                block = AttentionBlock(config, scheme, known)
                hidden = torch.randn(2, 5, 64)
                out = block(hidden, torch.arange(5).expand(2, 5))[0]
                if not bool(torch.isfinite(out).all()):
                    return "eager outputs are not finite"
                result = export_scheme(scheme, ws / "m.onnx", params=known, config=config, dtype=dtype)
                outputs = run_onnx(result.path, make_feed(result.manifest, FeedShape(2, 5, 3)))
                if not all(np.isfinite(np.asarray(o, dtype=np.float64)).all() for o in outputs.values()):
                    return "ONNX outputs are not finite"
                return None

            result = api(go)
            if result.hung:
                return "crash", "hung"
            if result.error is not None:
                if isinstance(result.error, AssertionError):
                    return "message", str(result.error)
                if not isinstance(result.error, PosencError):
                    return "crash", f"{type(result.error).__name__}: {str(result.error)[:140]}"
                return None
            if result.value is not None:
                return "wrong numbers", result.value
            return None

        tries.append(Try(f"{scheme} {label}", "parameter domains", run))
    return tries


OPTIMIZE_MAY_SUCCEED = ("manifest missing", "weights malicious pickle")
"""Tampers optimize may accept: a graph without a manifest is optimized as a foreign graph, and weights whose
sha256 matches the manifest are copied, never loaded (the pickle must still never run)."""


def tamper_tries(fx: Fixtures) -> list[Try]:
    """Manifests, weights and external data changed after export; engines changed after build."""
    from posenc.export import manifest_path_for, weights_path_for

    def edit(key: str, value: Any) -> Callable[[Path], None]:
        def apply(model: Path) -> None:
            path = manifest_path_for(model)
            data = json.loads(path.read_text())
            target = data
            *parents, last = key.split(".")
            for part in parents:
                target = target[part] if not part.isdigit() else target[int(part)]
            if value is KeyError:
                del target[last]
            else:
                target[last if not last.isdigit() else int(last)] = value
            path.write_text(json.dumps(data))

        return apply

    def write_manifest(text: str) -> Callable[[Path], None]:
        return lambda model: manifest_path_for(model).write_text(text)

    def outside_secret(model: Path) -> Path:
        secret = model.parent.parent / "secret.safetensors"
        shutil.copy2(weights_path_for(model), secret)  # the same bytes: only the path rule can refuse it
        return secret

    def weights_up(model: Path) -> None:
        outside_secret(model)
        edit("weights.path", "../secret.safetensors")(model)

    def weights_absolute(model: Path) -> None:
        edit("weights.path", str(outside_secret(model)))(model)

    def weights_link_out(model: Path) -> None:
        secret = outside_secret(model)
        weights_path_for(model).unlink()
        weights_path_for(model).symlink_to(secret)

    def weights_fifo(model: Path) -> None:
        weights_path_for(model).unlink()
        os.mkfifo(weights_path_for(model))

    def weights_flip(model: Path) -> None:
        data = bytearray(weights_path_for(model).read_bytes())
        data[-1] ^= 0xFF
        weights_path_for(model).write_bytes(bytes(data))

    def weights_pickle(model: Path) -> None:
        import pickle

        class Boom:
            def __reduce__(self) -> Any:
                return (os.system, (f"touch {model.parent / 'PWNED'}",))

        weights_path_for(model).write_bytes(pickle.dumps({"x": Boom()}))
        edit("weights.format", "torch.save(state_dict)")(model)
        edit("weights.sha256", _sha(weights_path_for(model)))(model)

    def model_flip(model: Path) -> None:
        model.write_bytes(model.read_bytes() + b"\x00")

    tampers: list[tuple[str, Callable[[Path], None], tuple[str, ...]]] = [
        ("manifest missing", lambda m: manifest_path_for(m).unlink(), ("no manifest",)),
        ("manifest not JSON", write_manifest("{not json"), ("json",)),
        ("manifest a list", write_manifest("[1]"), ("object",)),
        ("manifest FIFO", lambda m: (manifest_path_for(m).unlink(), os.mkfifo(manifest_path_for(m))), ("fifo",)),
        ("manifest unknown key", edit("surprise", 1), ("surprise", "unknown")),
        ("manifest missing key", edit("dtype", KeyError), ("dtype", "missing")),
        ("manifest max_positions 4096", edit("max_positions", 4096), ("max_positions", "edited")),
        (
            "manifest both limits 4096",
            lambda m: (edit("max_positions", 4096)(m), edit("build_max_positions", 4096)(m)),
            ("table", "edited"),
        ),
        ("manifest dtype float16", edit("dtype", "float16"), ("dtype", "float16", "does not")),
        ("manifest input renamed", edit("inputs.0.name", "x"), ("input", "x")),
        ("model modified", model_flip, ("corrupt", "re-export")),  # a trailing byte breaks the protobuf
        ("weights missing", lambda m: weights_path_for(m).unlink(), ("does not exist", "missing")),
        ("weights modified", weights_flip, ("sha256", "modified")),
        ("weights path ../secret", weights_up, ("out of",)),
        ("weights path absolute", weights_absolute, ("absolute",)),
        ("weights symlink out", weights_link_out, ("out of",)),
        ("weights FIFO", weights_fifo, ("fifo",)),
        ("weights malicious pickle", weights_pickle, ("weights", "pickle", "cannot read")),
    ]
    tries = []
    for label, tamper, words in tampers:
        for command in ("validate", "optimize"):

            def run(
                ws: Path, tamper: Callable = tamper, words: tuple = words, command: str = command, label: str = label
            ) -> Any:
                model = fx.copy("rope_op", ws / "m")
                tamper(model)
                argv = ["validate", model] if command == "validate" else [
                    "optimize", model, "--target", "trt", "-o", ws / "m" / "o.onnx"]  # fmt: skip
                if command == "optimize" and label in ("manifest dtype float16", "manifest input renamed"):
                    argv = ["validate", model, "--shape", "1,3"]  # optimize never reads these fields
                if command == "optimize" and label in OPTIMIZE_MAY_SUCCEED:
                    result = cli(argv)  # a graph without manifest is a foreign graph; hash-checked weights are copied
                    verdict = None if result.code in (0, 2) else judge_refusal(result, words)
                else:
                    verdict = refuse(argv, words, fifo="FIFO" in label, folder=ws)
                if (ws / "m" / "PWNED").exists():
                    return "security", "the pickle ran"
                for out in (ws / "m").glob("o.*"):
                    if b"secret" in out.read_bytes():
                        return "security", "read outside the model's folder"
                return verdict

            tries.append(Try(f"{command} <{label}>", "tampered artifacts", run))

    def external(kind: str) -> Callable[[Path], Path]:
        def make(ws: Path) -> Path:
            import onnx
            from onnx import helper, numpy_helper

            folder = ws / "m"
            folder.mkdir(parents=True)
            (ws / "secret.bin").write_bytes(np.arange(16, dtype=np.float32).tobytes())
            tensor = numpy_helper.from_array(np.zeros(16, dtype=np.float32), "w")
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            location = {"up": "../secret.bin", "absolute": str(ws / "secret.bin"), "link": "linked.bin"}[kind]
            if kind == "link":
                (folder / "linked.bin").symlink_to(ws / "secret.bin")
            entry = tensor.external_data.add()
            entry.key, entry.value = "location", location
            x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [16])
            y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [16])
            graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [tensor])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
            path = folder / "ext.onnx"
            path.write_bytes(model.SerializeToString())
            return path

        return make

    commands: dict[str, Callable[[Path, Path], list[str]]] = {
        "inspect": lambda m, ws: ["inspect", m],
        "optimize": lambda m, ws: ["optimize", m, "--target", "trt", "--no-parity", "-o", ws / "m" / "o.onnx"],
        "build": lambda m, ws: ["build", m, "--engine-target", "sm89", "-o", ws / "m" / "o.engine"],
        "validate": lambda m, ws: ["validate", m],
    }
    for kind in ("up", "absolute", "link"):
        for command, argv in commands.items():

            def run(ws: Path, kind: str = kind, argv: Callable = argv) -> Any:
                model = external(kind)(ws)
                verdict = refuse(argv(model, ws), ("outside", "out of", "absolute", "no manifest"), folder=ws)
                for out in (ws / "m").glob("o.*"):
                    if np.arange(16, dtype=np.float32).tobytes()[8:40] in out.read_bytes():
                        return "security", "embedded bytes from outside the model's folder"
                return verdict

            tries.append(Try(f"{command} <external data {kind}>", "tampered artifacts", run))

    def engine_tamper(change: Callable[[Path], None], words: tuple[str, ...]) -> Callable[[Path], Any]:
        def run(ws: Path) -> Any:
            if fx.engine is None:
                return "message", "no engine fixture (no TensorRT)"
            model = fx.copy("rope_trt", ws / "m")
            engine = Path(shutil.copy2(fx.engine, ws / "m" / fx.engine.name))
            shutil.copy2(fx.engine.with_name(fx.engine.name + ".manifest.json"), ws / "m")
            change(engine)
            return refuse(["validate", model, "--engine", engine], words, folder=ws)

        return run

    def flip(engine: Path) -> None:
        engine.write_bytes(engine.read_bytes()[:-1] + b"\x00")

    def edit_engine_manifest(engine: Path) -> None:
        path = engine.with_name(engine.name + ".manifest.json")
        data = json.loads(path.read_text())
        data["engine_sha256"] = "0" * 64
        path.write_text(json.dumps(data))

    tries += [
        Try("validate --engine <engine modified>", "tampered artifacts", engine_tamper(flip, ("does not match",))),
        Try(
            "validate --engine <manifest edited>",
            "tampered artifacts",
            engine_tamper(edit_engine_manifest, ("does not match",)),
        ),
    ]
    return tries


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def position_tries() -> list[Try]:
    """Positions outside the table in a plain ONNX Runtime session: an error or NaN, never a plausible number."""
    from posenc.schemes import specs
    from posenc.schemes.base import TableMode

    tries = []
    cache: dict[tuple[str, str], Path] = {}
    representatives = ("rope", "learned", "sinusoidal", "alibi", "t5", "tupe", "shaw", "deberta", "transformer_xl",
                       "rerope", "nope")  # fmt: skip  # one per family with precomputed tables (FLOATER: slow to build)
    schemes = [s.name for s in specs() if TableMode.PRECOMPUTED in s.table_modes and s.name in representatives]
    for scheme in schemes:
        for unit in ("op", "block"):
            for bad in ("negative", "at the table end", "far past"):

                def run(ws: Path, scheme: str = scheme, unit: str = unit, bad: str = bad) -> Any:
                    import onnxruntime as ort

                    from posenc.config import AttentionConfig
                    from posenc.errors import PosencError
                    from posenc.export import FeedShape, export_scheme, load_manifest, make_feed

                    config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=TABLE)
                    key = (scheme, unit)
                    if key not in cache:
                        made = api(lambda: export_scheme(scheme, ws.parent / f"pos_{scheme}_{unit}.onnx", unit=unit,
                                                       config=config, table_mode="precomputed"))  # fmt: skip
                        if made.error is not None:
                            if isinstance(made.error, PosencError):
                                return None  # no such unit for this scheme: nothing to feed
                            return "crash", f"export: {type(made.error).__name__}: {made.error}"
                        cache[key] = made.value.path
                    path = cache[key]
                    manifest = load_manifest(path)
                    feed = make_feed(manifest, FeedShape(2, 3, 0))
                    value = {"negative": -1, "at the table end": TABLE, "far past": TABLE + 1000}[bad]
                    for spec in manifest.inputs:
                        if spec.role == "positions":
                            array = feed[spec.name].copy()
                            array[0, -1] = value
                            feed[spec.name] = array
                    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                    result = api(lambda: session.run(None, feed))
                    if result.error is not None:
                        return None  # the runtime refused it
                    finite = all(np.isfinite(np.asarray(o, dtype=np.float64)).all() for o in result.value)
                    return ("wrong numbers", "finite outputs for a position outside the table") if finite else None

                tries.append(Try(f"ORT {scheme} {unit} position {bad}", "positions", run))

    def posenc_runner(bad: int) -> Callable[[Path], Any]:
        def run(ws: Path) -> Any:
            import torch

            from posenc import AttentionBlock, AttentionConfig

            config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=TABLE)
            block = AttentionBlock(config, "rope")
            ids = torch.tensor([[0, 1, bad]])
            return refuse(lambda: block(torch.randn(1, 3, 64), ids), ("position",))

        return run

    for bad in (-1, TABLE, 10**6):
        tries.append(Try(f"eager block position {bad}", "positions", posenc_runner(bad)))
    return tries


def api_tries(fx: Fixtures) -> list[Try]:
    """The Python API given what it cannot use."""
    import torch

    from posenc import AttentionBlock, AttentionConfig, build_scheme, functional
    from posenc.export import FeedShape, export_scheme, load_manifest, run_onnx

    def fresh_manifest(ws: Path) -> Any:
        return load_manifest(fx.copy("rope_op", ws / "m"))

    cases: list[tuple[str, Callable[[Path], Any], tuple[str, ...]]] = [
        ("apply_rope cos of the wrong length", lambda ws: functional.apply_rope(
            torch.randn(1, 2, 5, 8), torch.ones(1, 1, 4, 4), torch.zeros(1, 1, 4, 4)), ("broadcast",)),
        ("apply_rope odd rotary_dim", lambda ws: functional.apply_rope(
            torch.randn(1, 2, 5, 8), torch.ones(5, 4), torch.zeros(5, 4), rotary_dim=7), ("rotary_dim",)),
        ("rope_cos_sin float positions", lambda ws: functional.rope_cos_sin(
            torch.tensor([0.5]), torch.ones(4)), ("integer", "position")),
        ("rope_inv_freq odd rotary_dim", lambda ws: functional.rope_inv_freq(7), ("rotary_dim", "even")),
        ("alibi_slopes(0)", lambda ws: functional.alibi_slopes(0), ("num_heads", "heads")),
        ("t5_relative_bucket num_buckets=0", lambda ws: functional.t5_relative_bucket(
            torch.arange(4), num_buckets=0), ("num_buckets",)),
        ("sinusoidal_table(0, 8)", lambda ws: functional.sinusoidal_table(0, 8), ("num_positions", "positions")),
        ("AttentionBlock hidden 4e9", lambda ws: AttentionBlock(AttentionConfig(hidden_size=4_000_000_000,
                                                                                num_heads=1)), ("bytes",)),
        ("build_scheme max_positions=0", lambda ws: build_scheme("rope", AttentionConfig(), max_positions=0),
         ("max_positions",)),
        ("export_onnx unit=bogus", lambda ws: export_scheme("rope", ws / "m.onnx", unit="bogus"), ("unit",)),
        ("export_onnx to ''", lambda ws: export_scheme("rope", ""), ("empty",)),
        ("export_onnx to a folder", lambda ws: export_scheme("rope", ws), ("folder",)),
        ("load_manifest('')", lambda ws: load_manifest(""), ("empty",)),
        ("load_manifest(folder)", lambda ws: load_manifest(ws), ("folder", "does not exist")),
        ("FeedShape(-1, 1)", lambda ws: FeedShape(-1, 1), ("batch",)),
        ("run_onnx float32 position ids", lambda ws: run_onnx(
            fx.copy("rope_op", ws / "m"), {**_feed(fresh_manifest(ws)), "position_ids": np.zeros((2, 3), np.float32)}),
         ("int64",)),
        ("run_onnx position past the table", lambda ws: run_onnx(
            fx.copy("rope_op", ws / "m"), {**_feed(fresh_manifest(ws)), "position_ids": np.full((2, 3), 99)}),
         ("table", "position")),
    ]  # fmt: skip
    return [Try(name, "python api", lambda ws, fn=fn, words=words: refuse(lambda: fn(ws), words)) for name, fn, words
            in cases]  # fmt: skip


def _feed(manifest: Any) -> dict[str, np.ndarray]:
    from posenc.export import FeedShape, make_feed

    return make_feed(manifest, FeedShape(2, 3, 0))


# --------------------------------------------------------------------------------------------------
# Kills and races (real processes)
# --------------------------------------------------------------------------------------------------

KILL_CHILD = """
import os, signal, sys
from posenc.artifacts import files
target = int(os.environ.get("KILL_AT_REPLACE", "0"))
if target:
    real, calls = os.replace, [0]
    def replace(src, dst):
        calls[0] += 1
        if calls[0] == target:
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)
    files.os.replace = replace
from posenc.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _child(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", KILL_CHILD, *map(str, argv)],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _artifact_state(model: Path) -> str:
    """``none``, ``complete`` (every file posenc reads verifies), or what is wrong, as a posenc reader sees it."""
    from posenc.errors import PosencError
    from posenc.export import load_manifest, manifest_path_for, weights_path_for

    paths = (model, manifest_path_for(model), weights_path_for(model))
    if not any(p.exists() for p in paths):
        return "none"
    try:
        load_manifest(model)
    except PosencError as exc:
        return f"mismatched ({str(exc)[:80]})"
    return "complete"


def kill_tries(fx: Fixtures) -> list[Try]:
    export = ["export", "-s", "rope", "--unit", "op", "--max-positions", str(TABLE)]

    def after_kill(ws: Path, model: Path, had_old: bool) -> tuple[str, str] | None:
        state = _artifact_state(model)  # a reader: finishes an interrupted commit first
        if state.startswith("mismatched") or (had_old and state == "none"):
            return "files", f"after the kill: {state}"
        result = cli([*export, "-o", model])  # the next run
        if result.code != 0:
            return "files", f"the next run failed: {result.err.strip()[:120]}"
        leftovers = [p.name for p in model.parent.iterdir() if p.name.startswith(".")]
        if leftovers:
            return "files", f"staging left after the next run: {leftovers}"
        return None

    def kill_at_random(seed: int, old: bool) -> Callable[[Path], Any]:
        def run(ws: Path) -> Any:
            model = ws / "out" / "m.onnx"
            if old:
                cli([*export, "-o", model])
            child = _child([*export, "-o", model])
            time.sleep(random.Random(seed).uniform(3.0, 7.0))  # import, trace, write: somewhere in there
            child.send_signal(signal.SIGKILL)
            child.wait()
            return after_kill(ws, model, old)

        return run

    def kill_at_rename(step: int) -> Callable[[Path], Any]:
        def run(ws: Path) -> Any:
            model = ws / "out" / "m.onnx"
            cli([*export, "--seed", "1", "-o", model])
            child = _child([*export, "-o", model], {"KILL_AT_REPLACE": str(step)})
            child.wait()
            return after_kill(ws, model, True)

        return run

    def concurrent(ws: Path) -> Any:
        model = ws / "out" / "m.onnx"
        children = [_child([*export, "--seed", str(seed), "-o", model]) for seed in (1, 2, 3)]
        codes = [child.wait() for child in children]
        if any(codes):
            return "files", f"a concurrent writer failed: exit {codes}"
        state = _artifact_state(model)
        return None if state == "complete" else ("files", f"after concurrent writers: {state}")

    def concurrent_optimize(ws: Path) -> Any:
        source = fx.copy("rope_op", ws / "m")
        out = ws / "m" / "o.onnx"
        children = [_child(["optimize", source, "--target", target, "-o", out]) for target in ("trt", "ort-cpu", "trt")]
        codes = [child.wait() for child in children]
        if any(codes):
            return "files", f"a concurrent writer failed: exit {codes}"
        state = _artifact_state(out)
        return None if state == "complete" else ("files", f"after concurrent writers: {state}")

    def kill_optimize(seed: int) -> Callable[[Path], Any]:
        def run(ws: Path) -> Any:
            source = fx.copy("rope_block", ws / "m")
            out = ws / "m" / "o.onnx"
            child = _child(["optimize", source, "--target", "ort-cpu", "-o", out])
            time.sleep(random.Random(seed).uniform(2.5, 6.0))
            child.send_signal(signal.SIGKILL)
            child.wait()
            state = _artifact_state(out)
            if state.startswith("mismatched"):
                return "files", state
            cli(["optimize", source, "--target", "ort-cpu", "-o", out])
            leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(".")]
            return ("files", f"staging left: {leftovers}") if leftovers else None

        return run

    def interrupt(ws: Path) -> Any:
        model = ws / "out" / "m.onnx"
        child = _child([*export, "-o", model])
        time.sleep(4.0)
        child.send_signal(signal.SIGINT)
        code = child.wait()
        state = _artifact_state(model)
        if state.startswith("mismatched"):
            return "files", state
        leftovers = [p.name for p in model.parent.iterdir() if p.name.startswith(".")] if model.parent.exists() else []
        if leftovers:
            return "files", f"staging left: {leftovers}"
        # 130 from posenc's handler; -SIGINT when the signal lands before it is installed (still importing): Python
        # then ends by the signal, which a shell reports as 130 too
        return None if code in (0, 130, -signal.SIGINT) else ("message", f"Ctrl-C gave exit {code}")

    def sweep_killed(ws: Path) -> Any:
        scratch = Path(tempfile.gettempdir())
        before = {p.name for p in scratch.iterdir() if p.name.startswith("posenc-")}
        child = _child(["sweep", "-s", "rope", "--dtype", "fp32", "--last-position", "4096", "-o", ws / "s"])
        time.sleep(6.0)
        child.send_signal(signal.SIGKILL)
        child.wait()
        cli(["sweep", "-s", "rope", "--dtype", "fp32", "--table-mode", "dynamic", "--last-position", "64",
             "--per-bucket", "2", "-o", ws / "s2"])  # fmt: skip  # the next run
        after = {p.name for p in scratch.iterdir() if p.name.startswith("posenc-")}
        left = sorted(after - before)
        return ("files", f"left in {scratch}: {left}") if left else None

    tries = [Try(f"export killed at random time {i}", "kills and races", kill_at_random(i, i % 2 == 0))
             for i in range(4)]  # fmt: skip
    tries += [Try(f"export killed at rename {step}", "kills and races", kill_at_rename(step)) for step in (1, 2, 3, 4)]
    tries += [
        Try("export x3 concurrently", "kills and races", concurrent),
        Try("optimize x3 concurrently", "kills and races", concurrent_optimize),
        Try("optimize killed at random time", "kills and races", kill_optimize(1)),
        Try("export interrupted (Ctrl-C)", "kills and races", interrupt),
        Try("sweep killed", "kills and races", sweep_killed),
    ]
    return tries


def config_tries(fx: Fixtures) -> list[Try]:
    """Hostile config values, ambiguous weights, symlink loops, a symlinked hub blob store, damaged weights and a
    checkpoint changed since export (issue 25): each refused by name, or read as transformers reads it."""

    def ckpt(ws: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
        if fx.checkpoint is None:
            raise RuntimeError("no transformers: no checkpoint fixture")
        folder = Path(shutil.copytree(fx.checkpoint, ws / "ckpt"))
        if edit is not None:
            data = json.loads((folder / "config.json").read_text())
            edit(data)
            (folder / "config.json").write_text(json.dumps(data))
        return folder

    def setting(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
        def edit(data: dict[str, Any]) -> None:
            *parents, leaf = path.split(".")
            target = data
            for key in parents:
                target = target[key]
            target[leaf] = value

        return edit

    values: list[tuple[str, Any, tuple[str, ...]]] = [
        ("rope_parameters.rope_theta", "big", ("rope_theta",)),
        ("hidden_size", "64", ("hidden_size",)),
        ("hidden_size", True, ("hidden_size",)),
        ("num_hidden_layers", "two", ("num_hidden_layers",)),
        ("num_attention_heads", 0, ("num_attention_heads",)),
        ("num_attention_heads", 4.7, ("num_attention_heads",)),
        ("max_position_embeddings", 256.7, ("max_position_embeddings",)),
        ("max_position_embeddings", float("nan"), ("max_position_embeddings",)),
        ("max_position_embeddings", float("inf"), ("max_position_embeddings",)),
        ("rope_parameters", [1, 2], ("rope_parameters",)),
        ("rope_parameters", "default", ("rope_parameters",)),
        ("rope_scaling", [2.0], ("rope_scaling",)),
        ("rope_parameters.partial_rotary_factor", 0.3, ("partial_rotary_factor",)),
        ("layer_types", ["full_attention"], ("layer_types",)),
        ("layer_types", ["weird", "full_attention", "full_attention"], ("layer_types",)),
        ("attn_logit_softcapping", 0, ("attn_logit_softcapping",)),
    ]
    tries = []
    for field, value, words in values:
        label = f"{field}={json.dumps(value)}"

        def hf_model(ws: Path, field: str = field, value: Any = value, words: tuple[str, ...] = words) -> Any:
            folder = ckpt(ws, setting(field, value))
            return refuse(["export", "--hf-model", folder, "-o", ws / "out" / "m.onnx"], words, folder=ws)

        def hf_config(ws: Path, field: str = field, value: Any = value, words: tuple[str, ...] = words) -> Any:
            folder = ckpt(ws, setting(field, value))
            if field == "rope_parameters.partial_rotary_factor":
                return None  # --hf-config exports posenc's own scheme: a partial rotation is a valid one
            return refuse(["export", "--hf-config", folder / "config.json", "-o", ws / "m.onnx"], words, folder=ws)

        tries += [
            Try(f"export --hf-model <{label}>", "hostile configs", hf_model),
            Try(f"export --hf-config <{label}>", "hostile configs", hf_config),
        ]

    def deep(ws: Path) -> Any:
        folder = ckpt(ws)
        (folder / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
        return refuse(["export", "--hf-model", folder, "-o", ws / "out" / "m.onnx"], ("deep",), folder=ws)

    def loop(name: str) -> Callable[[Path], Any]:
        def run(ws: Path) -> Any:
            folder = ckpt(ws)
            target = folder / name
            if not target.exists():
                target = next(folder.glob("*.safetensors"))
            target.unlink()
            target.symlink_to(folder / "loop")
            (folder / "loop").symlink_to(target)
            return refuse(["export", "--hf-model", folder, "-o", ws / "out" / "m.onnx"], ("symlink loop",), folder=ws)

        return run

    def blobs_elsewhere(ws: Path) -> Any:
        repo = ws / "cache" / "models--org--m"
        snapshot = repo / "snapshots" / "rev"
        snapshot.mkdir(parents=True)
        elsewhere = ws / "elsewhere"
        elsewhere.mkdir()
        for index, path in enumerate(sorted(ckpt(ws).iterdir())):
            shutil.copy(path, elsewhere / f"hash{index}")
            (snapshot / path.name).symlink_to(Path("../../blobs") / f"hash{index}")
        (repo / "blobs").symlink_to(elsewhere)
        return refuse(["export", "--hf-model", snapshot, "-o", ws / "out" / "m.onnx"], ("blob store",), folder=ws)

    def ambiguous(ws: Path) -> Any:
        """A single model.safetensors beside a sharded index holding other weights: transformers reads the single
        file, and so must posenc (and say so)."""
        from safetensors.torch import load_file, save_file

        folder = ckpt(ws)
        index = folder / "model.safetensors.index.json"
        if index.exists():  # sharded: add a single file of other weights
            shards = sorted(folder.glob("model-*.safetensors"))
            single = {k: v + 1.0 for shard in shards for k, v in load_file(shard).items()}
            save_file(single, folder / "model.safetensors", metadata={"format": "pt"})
        else:  # one file: add a shard index of other weights
            single = load_file(folder / "model.safetensors")
            other = {k: v + 1.0 for k, v in single.items()}
            save_file(other, folder / "model-00001-of-00001.safetensors", metadata={"format": "pt"})
            weight_map = dict.fromkeys(other, "model-00001-of-00001.safetensors")
            index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        out = ws / "out" / "m.onnx"
        result = cli(["export", "--hf-model", folder, "--no-optimize", "-o", out])
        if result.code != 0:
            return judge_refusal(result) or ("message", f"exit {result.code}")
        from posenc.checkpoints.source import tensor_sha256

        source = json.loads(out.with_suffix(".manifest.json").read_text())["weights"]["source"]
        name = "model.layers.0.self_attn.q_proj.weight"
        if source.get("weights_file") != "model.safetensors" or source["tensors"][name] != tensor_sha256(single[name]):
            return "wrong numbers", f"read {source.get('weights_file')!r}, not model.safetensors as transformers does"
        return None

    def damaged(tensor: str, value: float, words: tuple[str, ...], *extra: str) -> Callable[[Path], Any]:
        def run(ws: Path) -> Any:
            from safetensors.torch import load_file, save_file

            folder = ckpt(ws)
            for shard in folder.glob("*.safetensors"):
                weights = load_file(shard)
                if tensor in weights:
                    weights[tensor][0, 0] = value
                    save_file(weights, shard, metadata={"format": "pt"})
            argv = ["export", "--hf-model", folder, *extra, "-o", ws / "out" / "m.onnx"]
            return refuse(argv, words, folder=ws)

        return run

    def changed(ws: Path) -> Any:
        """Dynamic NTK exported at factor 2, the checkpoint's factor then set to 8."""
        folder = ckpt(ws, setting("rope_parameters", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}))
        out = ws / "out" / "m.onnx"
        result = cli(["export", "--hf-model", folder, "--no-optimize", "-o", out])
        if result.code != 0:
            return judge_refusal(result) or ("message", f"exit {result.code}")
        data = json.loads((folder / "config.json").read_text())
        data["rope_parameters"]["factor"] = 8.0
        (folder / "config.json").write_text(json.dumps(data))
        return refuse(["validate", out, "--against-hf", folder], ("changed since export",), folder=ws)

    v_proj, o_proj = "model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight"
    tries += [
        Try("export --hf-model <config.json nested 100000 deep>", "hostile configs", deep),
        Try("export --hf-model <config.json a symlink loop>", "ambiguous weights", loop("config.json")),
        Try("export --hf-model <a shard a symlink loop>", "ambiguous weights", loop("model.safetensors")),
        Try("export --hf-model <hub cache, blobs a symlink elsewhere>", "ambiguous weights", blobs_elsewhere),
        Try("export --hf-model <model.safetensors beside a shard index>", "ambiguous weights", ambiguous),
        Try(
            "export --hf-model <NaN in v_proj.weight>",
            "changed checkpoints",
            damaged(v_proj, float("nan"), (v_proj,), "--layer", "1"),
        ),
        Try(
            "export --hf-model --dtype fp16 <o_proj 1e6>",
            "changed checkpoints",
            damaged(o_proj, 1e6, (o_proj,), "--layer", "1", "--dtype", "fp16"),
        ),
        Try("validate --against-hf <factor changed 2 -> 8>", "changed checkpoints", changed),
    ]
    return tries


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def _graph(path: Path, nodes: list, inputs: list, outputs: list, inits: list = (), domains: tuple = ()) -> Path:
    import onnx
    from onnx import helper

    opsets = [helper.make_opsetid("", 23), *(helper.make_opsetid(d, 1) for d in domains)]
    onnx.save(
        helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=opsets), path
    )
    return path


def _loop(path: Path, trips: int | None) -> Path:
    from onnx import TensorProto as T
    from onnx import helper as h

    body = h.make_graph(
        [h.make_node("Add", ["x_in", "one"], ["x_out"]), h.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, []),
         h.make_tensor_value_info("x_in", T.FLOAT, [1])],
        [h.make_tensor_value_info("c_out", T.BOOL, []), h.make_tensor_value_info("x_out", T.FLOAT, [1])],
        [h.make_tensor("one", T.FLOAT, [1], [1.0])],
    )  # fmt: skip
    inits = [h.make_tensor("cond", T.BOOL, [], [1]), h.make_tensor("x0", T.FLOAT, [1], [0.0])]
    if trips is not None:
        inits.append(h.make_tensor("M", T.INT64, [], [trips]))
    loop = h.make_node("Loop", ["M" if trips is not None else "", "cond", "x0"], ["y"], body=body)
    return _graph(path, [loop], [], [h.make_tensor_value_info("y", T.FLOAT, [1])], inits)


def graph_tries(fx: Fixtures) -> list[Try]:
    """Runaway graphs: huge loops, long chains, huge declared dims, unknown ops (issue 25)."""
    from onnx import TensorProto as T
    from onnx import helper as h

    def chain(ws: Path, n: int) -> Path:
        nodes = [h.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(n)]
        return _graph(ws / "chain.onnx", nodes, [h.make_tensor_value_info("t0", T.FLOAT, [1, 4])],
                      [h.make_tensor_value_info(f"t{n}", T.FLOAT, [1, 4])])  # fmt: skip

    def one(ws: Path, op: str, dims: list[int], domain: str = "") -> Path:
        node = h.make_node(op, ["x"], ["y"], domain=domain)
        values = [h.make_tensor_value_info(n, T.FLOAT, dims) for n in ("x", "y")]
        return _graph(ws / "one.onnx", [node], values[:1], values[1:], domains=(domain,) if domain else ())

    makers: list[tuple[str, Callable[[Path], Path], tuple[str, ...]]] = [
        ("Loop of 2**62 iterations", lambda ws: _loop(ws / "loop.onnx", 2**62), ("trip count",)),
        ("Loop without a trip count (while)", lambda ws: _loop(ws / "while.onnx", None), ("no constant trip count",)),
        ("100,000-node chain", lambda ws: chain(ws, 100_000), ("nodes",)),
        ("input declared [2**40, 2**40]", lambda ws: one(ws, "Relu", [2**40, 2**40]), ("declared",)),
        ("op of domain com.evil", lambda ws: one(ws, "EvilOp", [1, 4], "com.evil"), ("com.evil::EvilOp",)),
    ]
    tries = []
    for label, make, words in makers:
        # inspect reads and runs nothing: it is bounded by what it walks (loops, node count), not by feeds or ops
        readers = ("optimize", "inspect") if "Loop" in label or "chain" in label else ("optimize",)
        for command in readers:

            def run(ws: Path, make: Callable[[Path], Path] = make, words: tuple[str, ...] = words,
                    command: str = command) -> tuple[str, str] | None:  # fmt: skip
                path = make(ws)
                extra = ["-o", str(ws / "out.onnx"), "--target", "ort-cpu"] if command == "optimize" else []
                return refuse([command, str(path), *extra, *(["--no-tensorrt"] if command == "inspect" else [])],
                              words, folder=ws, timeout=60)  # fmt: skip

            tries.append(Try(f"{command} {label}", "graphs", run))
    return tries


def quantized_tries(fx: Fixtures) -> list[Try]:
    """Quantized checkpoints: fp8 block scales dequantized exactly; every other method refused by name (issue 25)."""
    import torch
    from safetensors.torch import load_file, save_file

    def variant(ws: Path, section: dict | None, change: Callable[[dict], None]) -> Path:
        assert fx.checkpoint is not None
        folder = ws / "ckpt"
        shutil.copytree(fx.checkpoint, folder)
        state = load_file(folder / "model.safetensors")
        change(state)
        save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((folder / "config.json").read_text())
        if section is not None:
            config["quantization_config"] = section
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    q = "model.layers.0.self_attn.{}_proj.weight"

    def fp8(state: dict) -> None:
        for p in "qkvo":
            w = state[q.format(p)].float()
            scale = (w.abs().amax() / 448.0).reshape(1, 1).clamp(min=1e-12)
            state[q.format(p)] = (w / scale).to(torch.float8_e4m3fn)
            state[q.format(p) + "_scale_inv"] = scale

    def int8(state: dict) -> None:
        w = state[q.format("q")]
        state[q.format("q")] = torch.randint(-127, 128, w.shape, dtype=torch.int8)
        state[q.format("q")[: -len("weight")] + "SCB"] = torch.ones(w.shape[0])

    fp8_section = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}

    def exported_exactly(ws: Path) -> tuple[str, str] | None:
        folder = variant(ws, fp8_section, fp8)
        out = ws / "fp8.onnx"
        result = cli(["export", "--hf-model", str(folder), "-o", str(out)])
        if result.code != 0:
            return judge_refusal(result) or ("message", f"exit {result.code}: {result.err.strip()[-160:]}")
        stored, weights = load_file(folder / "model.safetensors"), load_file(ws / "fp8.weights.safetensors")
        expected = stored[q.format("q")].float() * stored[q.format("q") + "_scale_inv"].float()
        if not torch.equal(weights["q_proj.weight.T"].T, expected):
            return "wrong numbers", "q_proj is not the dequantized fp8 weight"
        check = cli(["validate", str(out), "--against-hf", str(folder), "--shape", "1,4,0"])
        return None if check.code == 0 else ("wrong numbers", f"validate --against-hf exit {check.code}")

    refusals = [
        ("bitsandbytes int8 q_proj + SCB", {"quant_method": "bitsandbytes", "load_in_8bit": True}, int8,
         ("bitsandbytes int8",)),
        ("bitsandbytes nf4", {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
         int8, ("bitsandbytes nf4",)),
        ("gptq", {"quant_method": "gptq", "bits": 4}, int8, ("gptq",)),
        ("awq", {"quant_method": "awq", "bits": 4}, int8, ("awq",)),
        ("fp8 static activations", {**fp8_section, "activation_scheme": "static"}, fp8, ("static",)),
        ("fp8 weights, quantization_config removed", None, fp8, ("float8_e4m3fn",)),
        ("int8 weights, quantization_config removed", None, int8, ("int8",)),
    ]  # fmt: skip
    tries = [Try("fp8 block scales: exported dequantized, validate passes", "quantized", exported_exactly)]
    for label, section, change, words in refusals:

        def run(ws: Path, section: dict | None = section, change: Callable[[dict], None] = change,
                words: tuple[str, ...] = words) -> tuple[str, str] | None:  # fmt: skip
            folder = variant(ws, section, change)
            return refuse(["export", "--hf-model", str(folder), "-o", str(ws / "out" / "m.onnx")], words)

        tries.append(Try(f"export {label}", "quantized", run))
    return tries


GROUPS = {
    "inputs": input_tries,
    "checkpoints": checkpoint_tries,
    "outputs": output_tries,
    "numbers": number_tries,
    "parameters": lambda fx: parameter_tries(),
    "tampered": tamper_tries,
    "positions": lambda fx: position_tries(),
    "api": api_tries,
    "kills": kill_tries,
    "configs": config_tries,
    "graphs": graph_tries,
    "quantized": quantized_tries,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(GROUPS), help="run only these groups")
    parser.add_argument("--json", metavar="OUT.json", help="write every try and its outcome")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (default: a temporary folder)")
    args = parser.parse_args(argv)
    os.environ.setdefault("POSENC_QUIET", "1")
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="posenc-hostile-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        fx = make_fixtures(root / "fixtures")
        outcomes = []
        for group in args.only or list(GROUPS):
            for index, attempt in enumerate(GROUPS[group](fx)):
                ws = root / group / f"{index:03d}"
                ws.mkdir(parents=True, exist_ok=True)
                try:
                    verdict = attempt.run(ws)
                except Exception as exc:  # the probe itself failed to set the try up
                    verdict = ("crash", f"probe: {type(exc).__name__}: {exc}")
                outcomes.append((attempt, verdict))
                if verdict is not None:
                    print(f"FAIL [{verdict[0]}] {attempt.group}: {attempt.name}: {verdict[1]}", flush=True)
                with contextlib.suppress(OSError):
                    for path in ws.rglob("*"):  # FIFOs and devices go with the folder
                        if path.is_symlink() or not (path.is_file() or path.is_dir()):
                            path.unlink()
        failures = Counter(v[0] for _, v in outcomes if v is not None)
        clean = sum(1 for _, v in outcomes if v is None)
        by_group = Counter(a.group for a, _ in outcomes)
        print(f"\n{len(outcomes)} tries over every subcommand and the Python API; {clean} handled cleanly.")
        for name in CLASSES:
            print(f"  {name:14} {failures.get(name, 0)}")
        print("tries per group: " + ", ".join(f"{g} {n}" for g, n in by_group.items()))
        print(f"({time.perf_counter() - started:.0f} s)")
        if args.json:
            rows = [
                {"group": a.group, "try": a.name, "clean": v is None, "class": v[0] if v else None,
                 "reason": v[1] if v else None}
                for a, v in outcomes
            ]  # fmt: skip
            Path(args.json).write_text(json.dumps({"tries": len(rows), "clean": clean, "rows": rows}, indent=1))
        return 0 if not failures else 1
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
