"""One model type of the census, run in its own process: tiny checkpoint, then posenc's CLI on each layer kind.

``python -m posenc.census.worker TYPE_JSON --workdir DIR --out RESULT.json`` (started by
:mod:`posenc.census.run`, under a time and memory limit):

1. :func:`posenc.census.tiny.tiny_config` and :func:`~posenc.census.tiny.save_tiny_model` (seeded, never
   downloaded) into ``DIR/checkpoint``;
2. :func:`posenc.census.anatomy.read_anatomy`: the scheme and the layer kinds, from the model transformers built;
3. per layer kind with attention: ``posenc export --hf-model DIR/checkpoint --layer N [--layer-type STACK] -o ...
   --json`` and, where it exported, ``posenc validate MODEL --against-hf DIR/checkpoint --json`` — posenc's own
   command line, run in this process (``posenc.cli.main``), exactly as a user types it;
4. the path from the manifest (:func:`posenc.census.route.classify`), the parity from the report: the largest
   error against the checkpoint's transformers module over the rows that decide the verdict.

The result is rewritten after every step, so a type stopped by its time limit keeps what it finished.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posenc.census.route import REFUSED, classify, module_of
from posenc.census.types import ModelType
from posenc.process import batch_gc

MAX_KINDS = 6
"""Layer kinds exported per type, at most (a per-layer config that makes every layer its own kind stops here)."""
EAGER_REFERENCE = "eager-fp64"
"""The name of posenc's own float64 rebuild in a parity report (not a transformers reference)."""


def _message(text: str, limit: int = 400) -> str:
    """The error a posenc command printed: its ``error:`` line, else the exception line of a traceback."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if ": error: " in line:
            message = line.split(": error: ", 1)[1]
            cut = message.find("; supported model types:")
            message = message[:cut] + "." if cut > 0 else message
            return message[:limit]
    tail = [line for line in lines if not line.startswith(("posenc ", "File ", "^", "~"))]
    return (tail[-1] if tail else (lines[-1] if lines else "no output"))[:limit]


def run_cli(argv: Sequence[str]) -> tuple[int, str, str]:
    """``posenc ARGV`` in this process: ``(exit status, stdout, stderr)``."""
    from posenc.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(argv))
        except SystemExit as exc:  # argparse, or a command that exits
            status = exc.code if isinstance(exc.code, int) else 2
        except BaseException:  # a crash of the command itself: recorded for this kind, the census goes on
            traceback.print_exc()
            status = 3
    return status, out.getvalue(), err.getvalue()


def parity(report: Mapping[str, Any]) -> dict[str, Any]:
    """The census's parity cell from a ``posenc validate --json`` report: the verdict, the largest error against
    the checkpoint's transformers module and against posenc's float64 rebuild (rows that decide the verdict)."""
    rows = [row for row in report.get("rows", []) if not row.get("informational")]
    hf = [row for row in rows if row.get("reference") != EAGER_REFERENCE]
    eager = [row for row in rows if row.get("reference") == EAGER_REFERENCE]

    def worst(selected: list[Mapping[str, Any]]) -> float | None:
        values = [float(row.get("max_abs_error", float("inf"))) for row in selected]
        return max(values) if values else None

    return {
        "passed": bool(report.get("passed")),
        "worst_hf": worst(hf),
        "worst_eager": worst(eager),
        "rows": len(rows),
        "failed": sorted({f"{row.get('reference')} {row.get('output')}" for row in rows if not row.get("passed")}),
    }


def export_kind(checkpoint: Path, folder: Path, info: ModelType, kind: Mapping[str, Any]) -> dict[str, Any]:
    """Export and validate one layer kind through posenc's CLI; the census's record of it."""
    name = f"layer{kind['layer']}" + (f"_{kind['stack']}" if kind["stack"] else "")
    model = folder / f"{name}.onnx"
    argv = ["export", "--hf-model", str(checkpoint), "--layer", str(kind["layer"])]
    if kind["stack"]:
        argv += ["--layer-type", str(kind["stack"])]
    started = time.monotonic()
    status, out, err = run_cli([*argv, "-o", str(model), "--json"])
    record: dict[str, Any] = {"export_status": status, "export_seconds": round(time.monotonic() - started, 2)}
    if status != 0:
        return {**record, "path": REFUSED, "reason": _message(err or out)}
    try:
        manifest = json.loads(out)
    except json.JSONDecodeError:
        return {**record, "path": "unknown", "reason": f"export printed no manifest: {_message(out + err)}"}
    route = classify(manifest, info.name, info.text_type)
    record.update(
        path=route.path,
        module=module_of(manifest),
        family=route.family,
        posenc_scheme=str(manifest.get("scheme", "")),
        kept=list(route.kept),
        replaced=list(route.replaced),
    )
    started = time.monotonic()
    status, out, err = run_cli(["validate", str(model), "--against-hf", str(checkpoint), "--json"])
    record["validate_status"] = status
    record["validate_seconds"] = round(time.monotonic() - started, 2)
    try:
        record["parity"] = parity(json.loads(out))
    except json.JSONDecodeError:
        record["parity"] = {"passed": False, "error": _message(err or out)}
    return record


def census_type(info: ModelType, workdir: Path, out: Path, *, seed: int = 0) -> dict[str, Any]:
    """The census of one model type (see the module docstring); also written to ``out`` after every step."""
    from posenc.artifacts.files import write_json_atomic
    from posenc.census.anatomy import read_anatomy

    started = time.monotonic()
    result: dict[str, Any] = {**info.__dict__, "status": "running", "stage": "config", "layers": []}

    def save(**changes: Any) -> None:
        result.update(changes, seconds=round(time.monotonic() - started, 2))
        write_json_atomic(out, result)

    save()
    checkpoint = workdir / "checkpoint"
    try:
        model, tiny = _build(info, checkpoint, seed, save)
        save(stage="anatomy")
        anatomy = read_anatomy(model, tiny.config)
        del model
        gc.collect()
    except Exception as exc:
        reason = str(exc) if isinstance(exc, _NotBuiltError) else _error(exc)
        default = _meta_anatomy(info)
        if default is not None:  # the scheme is still known where the default config builds (on the meta device)
            result.update(scheme=default.scheme, evidence=[*default.evidence, "read from the default config"])
        return _finish(result, save, "no-checkpoint", reason)
    kinds = [dict(kind.__dict__) for kind in anatomy.kinds]
    result.update(scheme=anatomy.scheme, evidence=list(anatomy.evidence), layers=kinds)
    save(stage="export")
    exported = 0
    for kind in kinds:
        if not kind["attention"]:
            kind.update(path="skipped", reason=kind["skipped"])
            continue
        if exported == MAX_KINDS:
            kind.update(path="skipped", reason=f"more than {MAX_KINDS} layer kinds: not exported")
            continue
        exported += 1
        kind.update(export_kind(checkpoint, workdir / "onnx", info, kind))
        save()
    same_modules(kinds)
    save()
    if not kinds:
        return _finish(result, save, "ok", "no layer stack found in the text model")
    if not any(kind["attention"] for kind in kinds):
        built = f" (it builds {anatomy.evidence[0]})" if anatomy.evidence else ""
        return _finish(result, save, "ok", f"no layer of the default config holds attention{built}")
    return _finish(result, save, "ok", "")


def same_modules(kinds: list[dict[str, Any]]) -> None:
    """Fail the exported layer kinds of a type that exported one module (``module``:
    :func:`posenc.census.route.module_of`) between them: two kinds of a type are two modules of its model, so one
    module captured for both is a capture error (LED's encoder kind once captured its decoder's attention), never two
    passes. Each such kind's ``parity`` becomes failed, naming the other kinds and the module."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for kind in kinds:
        if kind.get("module") and kind.get("path") not in (REFUSED, "skipped", None):
            groups.setdefault(str(kind["module"]), []).append(kind)
    for module, group in groups.items():
        if len(group) < 2:
            continue
        names = [f"{k['stack']} layer {k['layer']}" if k.get("stack") else f"layer {k['layer']}" for k in group]
        for kind, name in zip(group, names, strict=True):
            others = ", ".join(n for n in names if n != name)
            same = f"the same module as {others} ({module}): a capture error"
            kind["parity"] = {**(kind.get("parity") or {}), "passed": False, "failed": [same], "same_module": same}


class _NotBuiltError(Exception):
    """No tiny config of the type builds a model; the message says why (and whether the default config does)."""


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:240]}"


_BASE_DEFAULTS = {"initializer_range": 0.02}
_MISSING = re.compile(r"has no attribute '(\w*token_id|initializer_range)'")
MAX_CANDIDATES = 9
"""Tiny configs tried per type before the census gives up on building it (every size variant, and the first
variant at twice its layers: :func:`posenc.census.tiny.tiny_configs`)."""


def _build(info: ModelType, checkpoint: Path, seed: int, save: Any) -> tuple[Any, Any]:
    """The first tiny config whose model builds, saved into ``checkpoint``: ``(model, tiny config)``. The type's
    model class first, with every candidate config; then its other classes (``reformer``'s causal LM head needs
    ``is_decoder``, its masked LM head does not) with the first one.

    Raises:
        _NotBuiltError: none builds; the message gives the first error and whether transformers' default config
            builds the model at all (on the meta device: no memory), which tells a shrinking problem from a
            default config that is not runnable as it stands.
    """
    from posenc.census.tiny import tiny_configs

    errors: list[str] = []
    first = None
    for index, tiny in enumerate(tiny_configs(info.name)):
        if index == MAX_CANDIDATES:
            break
        first = first or tiny
        built = _try_build(info.model_class, tiny, checkpoint, seed, save, errors)
        if built is not None:
            return built, tiny
    if first is not None:
        for cls in _other_classes(info, first.config):
            built = _try_build(cls, first, checkpoint, seed, save, errors)
            if built is not None:
                save(model_class=cls)
                return built, first
    others = f" (and {len(errors) - 1} more attempts)" if len(errors) > 1 else ""
    raise _NotBuiltError(f"{errors[0]}{others}; {_default_builds(info)}" if errors else "no tiny config")


def _other_classes(info: ModelType, config: Any) -> list[str]:
    from posenc.census.types import model_classes_for

    composite = info.kind == "multimodal"
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    classes = model_classes_for(info.name, type(config), encoder_decoder, composite)
    return [c.__name__ for c in classes if c.__name__ != info.model_class][:3]


def _try_build(model_class: str, tiny: Any, checkpoint: Path, seed: int, save: Any, errors: list[str]) -> Any:
    """``save_tiny_model`` of one class and config, or None (the error appended to ``errors``)."""
    import shutil

    from posenc.census.tiny import save_tiny_model

    build = {"layers": tiny.layers, "kinds_kept": tiny.kinds_kept, "targets": str(tiny.targets)}
    save(stage="model", build={**build, "mode": tiny.mode} if tiny.mode else build)
    for _ in range(3):
        try:
            return save_tiny_model(tiny.config, model_class, checkpoint, seed=seed)
        except AttributeError as exc:
            missing = _MISSING.search(str(exc))
            shutil.rmtree(checkpoint, ignore_errors=True)
            if missing is None:
                errors.append(_error(exc))
                return None
            # A field the config class no longer declares but its model reads (Llama4Config's pad_token_id,
            # Pix2StructTextConfig's initializer_range): PretrainedConfig's own default for it.
            name = missing.group(1)
            for config in (tiny.config, tiny.config.get_text_config(decoder=True)):
                setattr(config, name, None if name.endswith("token_id") else _BASE_DEFAULTS[name])
        except Exception as exc:  # the next candidate may build
            errors.append(_error(exc))
            shutil.rmtree(checkpoint, ignore_errors=True)
            return None
    return None


def _default_model(info: ModelType) -> tuple[Any, Any]:
    """``(model on the meta device or the exception, config)`` of transformers' default config: no memory."""
    import torch
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from posenc.census.types import model_class_for
    from posenc.checkpoints.reference import import_transformers

    config = CONFIG_MAPPING[info.name]()
    cls = getattr(import_transformers(), info.model_class, None) or model_class_for(info.name, type(config))
    try:
        with torch.device("meta"):
            return cls(config), config  # type: ignore[misc]  # a model class
    except Exception as exc:  # the caller reports it
        return exc, config


def _default_builds(info: ModelType) -> str:
    model, _ = _default_model(info)
    if isinstance(model, Exception):
        return f"transformers' default config does not build {info.model_class} either ({_error(model)})"
    return (
        f"transformers' default config builds {info.model_class} on the meta device (no weights initialised): "
        "the shrunk sizes do not fit together, or the initialisation fails"
    )


def _meta_anatomy(info: ModelType) -> Any:
    """The anatomy of the default config's model on the meta device, or None where it does not build."""
    from posenc.census.anatomy import read_anatomy

    try:
        model, config = _default_model(info)
        return None if isinstance(model, Exception) else read_anatomy(model, config)
    except Exception:  # reading a model that only exists on the meta device may fail too: no scheme then
        return None


def _finish(result: dict[str, Any], save: Any, status: str, reason: str) -> dict[str, Any]:
    save(status=status, stage="done", reason=reason)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posenc.census.worker", description=__doc__)
    parser.add_argument("type_json", help="the ModelType as JSON")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch

    torch.set_num_threads(1)
    info = ModelType(**json.loads(args.type_json))
    workdir = Path(args.workdir)
    (workdir / "onnx").mkdir(parents=True, exist_ok=True)
    with batch_gc():
        census_type(info, workdir, Path(args.out), seed=args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
