"""Multi-step decode parity: a sequence of steps through ONNX Runtime, each one held to the eager block.

A decode sequence carries state: the KV cache. Each candidate graph runs the whole sequence with its own cache
(:class:`OrtDecodeRunner`): a ``block`` graph gets its previous presents back as ``past_key``/``past_value``; a
``block-inplace`` graph keeps one preallocated buffer per cache, bound as both the cache input and the present
output (ONNX Runtime IOBinding), so every step writes into the same memory, as a deployment does. The reference is
the float64 eager :class:`~posenc.blocks.AttentionBlock` (``forward``, concatenated cache) carrying its own cache
through the same steps (:func:`eager_decode_reference`). Rows come from the one comparison path
(:func:`posenc.validate.compare.compare`), one per step and output: ``out``, and the filled part of each cache
(``present_key`` / ``present_value``, slots ``0 .. past + S - 1``). A traced graph whose cache holds more
(:mod:`posenc.trace.caches`: a DSA layer's ``past_indexer_key``, a hybrid layer's ``past_conv_state_0`` ...) gets
each ``present_<name>`` back as ``past_<name>`` too (empty, or zeros of its fixed shape, before the first step:
the state a model starts from) and each is compared as an output; the reference carries them likewise, starting from
no cache at all (the model's first call).

The default sequence (:func:`decode_schedule`): a prefill, :data:`DECODE_STEPS` single-token steps, then a long
jump: one token at the last position the model serves (``jump="position"``), or, for schemes that need contiguous
positions, a chunk that fills the cache to its last slot followed by one token there (``jump="fill"``).

A sliding-window block whose in-place cache is a ring (the manifest's ``cache_ring``: ``C`` slots, token ``t`` at
slot ``t mod C``) steps over the positions the model serves, not its ``C`` slots, so the default sequence wraps the
ring; a step bringing more tokens than the ring serves is cut into calls it serves (:func:`ring_schedule`). Its
cache rows compare the last ``min(P, C)`` tokens (the ring unrolled in token order) with the same tokens of every
reference's cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from posenc.artifacts.files import reading
from posenc.dtypes import NUMPY_DTYPES
from posenc.errors import ConfigError
from posenc.export.eager import load_eager
from posenc.export.manifest import Manifest, load_manifest
from posenc.export.runtime import check_model_file, ort_session
from posenc.export.shape_rules import check_shapes, fit_shapes
from posenc.export.shapes import Shape
from posenc.export.units import BLOCK_INPLACE, InPlaceBlock
from posenc.records import to_json
from posenc.schemes.base import Tolerance
from posenc.validate.compare import ComparisonRow, Reference, Verdict, compare
from posenc.validate.feeds import serving_limit
from posenc.validate.runners import REFERENCE_NAME, TorchModuleRunner, bind_in_place, feed_metadata
from posenc.validate.steps import (
    DECODE_STEPS,
    OUTPUTS,
    decode_outputs,
    decode_schedule,
    keep_last,
    ring_schedule,
    ring_slots,
    step_feeds,
    stream_slots,
)
from posenc.validate.tolerance import RULE, format_margin, tolerances_for

DECODE_REFERENCE = "float64 eager posenc block (CPU), its concatenated cache carried through the steps"


StepFn = Callable[..., tuple[torch.Tensor, ...]]
"""``fn(hidden, position_ids, past_key, past_value, ...) -> (out, present_key, present_value, ...)``: a block, or a
checkpoint's transformers module called like one (every past ``None`` at the first step)."""


def stepping_runner(
    fn: StepFn,
    name: str,
    dtype: torch.dtype = torch.float64,
    axes: int | None = None,
    outputs: Sequence[str] = OUTPUTS,
) -> Any:
    """A polygraphy runner that calls ``fn`` on each step's ``hidden`` (cast to ``dtype``) and ``position_ids``
    (broadcast to ``[axes, B, S]`` for multi-axis models) with the presents of its previous call as the past, and
    the step's second streams last (a traced layer's): the reference carries its own cache (every output after
    ``out``, :func:`decode_outputs`) through the sequence."""
    state: list[torch.Tensor | None] = [None] * (len(outputs) - 1)

    def step(feed: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        hidden = torch.from_numpy(np.asarray(feed["hidden"], dtype=np.float64)).to(dtype)
        positions = torch.from_numpy(np.asarray(feed["position_ids"], dtype=np.int64))
        if axes is not None:
            positions = positions.expand(axes, *positions.shape)
        streams = [torch.from_numpy(np.asarray(v, dtype=np.float64)).to(dtype) for k, v in feed.items() if k not in
                   ("hidden", "position_ids")]  # fmt: skip
        got = fn(hidden, positions, *state, *streams)
        state[:] = got[1:]
        return dict(zip(outputs, got, strict=True))

    return TorchModuleRunner(step, name, list(outputs))


def eager_decode_reference(path: str | os.PathLike[str], manifest: Manifest | None = None) -> Reference:
    """The float64 eager block of an exported ``block`` / ``block-inplace`` graph, stepping its own cache."""
    module, manifest = load_eager(path, manifest=manifest)
    block = module.block if isinstance(module, InPlaceBlock) else module
    return Reference(stepping_runner(block, REFERENCE_NAME, outputs=decode_outputs(manifest)), DECODE_REFERENCE)


class OrtDecodeRunner(BaseRunner):
    """An exported block on ONNX Runtime, carrying its KV cache from step to step (a polygraphy runner).

    Args:
        model: the ONNX file (or serialized model, e.g. bf16-emulated).
        manifest: its manifest (``block`` or ``block-inplace``).
        batch: rows of every step.
        name: runner name.
        providers: ONNX Runtime providers.
        seed: seed of the values the in-place caches hold before they are written (the attention must not read
            them).

        kept: return only the last ``kept`` tokens of each cache (validating beside a ring cache).

    Each call takes ``hidden`` and ``position_ids`` and returns ``out`` and the filled slots of each cache (a ring's
    in token order: the last ``min(P, C)`` tokens).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | bytes,
        manifest: Manifest,
        batch: int,
        name: str,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        seed: int = 0,
        kept: int | None = None,
    ) -> None:
        super().__init__(name=name, prefix="ort-decode")
        if manifest.unit not in ("block", BLOCK_INPLACE):
            raise ConfigError(f"decode steps need a block graph (unit block or block-inplace), not {manifest.unit!r}.")
        carried = {"hidden", "position_ids", "past_key", "past_value", "key_cache", "value_cache", "past_length"}
        if not {"past_key", "key_cache"} & set(manifest.input_names):
            raise ConfigError(
                "this graph takes no cache (its model calls its attention without one): there is no decode step to "
                "carry. Validate it with single calls (posenc validate, --against-hf)."
            )
        self.streams = [slot.name for slot in stream_slots(manifest)]  # fed from each step's feed
        if self.streams and manifest.unit == BLOCK_INPLACE:
            raise ConfigError(f"an in-place graph with second streams ({', '.join(self.streams)}) is not served here.")
        returned = {f"past_{name[8:]}" for name in manifest.output_names if name.startswith("present_")}
        extra = [name for name in manifest.input_names if name not in carried | returned and name not in self.streams]
        if extra:
            raise ConfigError(
                f"this graph takes the input {extra[0]!r}, which is no cache it returns; decode steps carry caches "
                f"(past_<name> -> present_<name>) only. Validate it with single calls (posenc validate, --against-hf)."
            )
        self.outputs = decode_outputs(manifest)
        self.model = model if isinstance(model, bytes) else str(model)
        self.manifest = manifest
        self.batch = batch
        self.providers = list(providers)
        self.seed = seed
        self.kept = kept
        self.in_place = manifest.unit == BLOCK_INPLACE
        self.ring = ring_slots(manifest)
        ids = manifest.input("position_ids").shape
        self.axes = int(ids[0]) if len(ids) == 3 else None  # multi-axis ids [A, B, S] (M-RoPE, axial)

    def get_input_metadata_impl(self) -> TensorMetadata:
        meta = TensorMetadata()
        dtype = np.float32 if self._carried_float32 else NUMPY_DTYPES[self.manifest.dtype]
        meta.add("hidden", dtype, ("batch", "seq", int(self.manifest.attention["hidden_size"])))
        meta.add("position_ids", np.int64, ("batch", "seq"))
        for slot in stream_slots(self.manifest):
            meta.add(slot.name, dtype, slot.shape)
        return meta

    @property
    def _carried_float32(self) -> bool:
        return self.manifest.dtype == "bfloat16"  # a bf16 graph runs emulated, its activations carried as float32

    def activate_impl(self) -> None:
        import onnxruntime as ort

        self.session = ort_session(self.model, self.providers, check=False)
        config = self.manifest.attention_config()
        dtype = np.float32 if self._carried_float32 else NUMPY_DTYPES[self.manifest.dtype]
        self.past = 0
        if self.in_place:
            slots = int(self.manifest.input("key_cache").shape[2])
            rng = np.random.default_rng(self.seed)
            shapes = [(self.batch, config.num_kv_heads, slots, width) for width in (config.head_dim, config.value_dim)]
            self.buffers = [rng.standard_normal(shape).astype(np.float32).astype(dtype) for shape in shapes]
            self.caches = [ort.OrtValue.ortvalue_from_numpy(buffer) for buffer in self.buffers]  # shares memory
        else:  # each cache's own heads and width (a traced layer's values may differ from its keys in width)
            self.presents = [self._empty_past(f"past_{name[8:]}", dtype) for name in self.outputs[1:]]

    def _empty_past(self, name: str, dtype: Any) -> np.ndarray:
        """The cache input ``name`` before the first step, as the manifest records it: ``[B, heads, 0, width]`` (no
        cached position), or zeros of a fixed-size state ``[B, ...]``."""
        shape = self.manifest.input(name).shape
        return np.zeros([self.batch if d == "batch" else 0 if d == "past" else int(d) for d in shape], dtype=dtype)

    def infer_impl(self, feed_dict: Mapping[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        start = time.perf_counter()
        hidden, positions = feed_dict["hidden"], feed_dict["position_ids"]
        seq = int(hidden.shape[1])
        if self.axes is not None:  # text-only steps: the [B, S] ids stand for every axis, as in the eager block
            positions = np.ascontiguousarray(np.broadcast_to(positions, (self.axes, *positions.shape)))
        if self.in_place:
            feed = {"hidden": hidden, "position_ids": positions, "key_cache": None, "value_cache": None}
            feed["past_length"] = np.full(self.batch, self.past, dtype=np.int64)
            caches = dict(zip(("key_cache", "value_cache"), self.caches, strict=True))
            binding = bind_in_place(self.session, feed, caches)  # the same buffers, written in place
            self.session.run_with_iobinding(binding)
            out = binding.copy_outputs_to_cpu()[len(caches)]
            self.past += seq
            if self.ring is None:
                key, value = (buffer[:, :, : self.past].copy() for buffer in self.buffers)
            else:  # the ring unrolled: tokens max(0, P - C) .. P - 1 at slots t mod C
                tokens = np.arange(max(0, self.past - self.ring), self.past) % self.ring
                key, value = (buffer[:, :, tokens].copy() for buffer in self.buffers)
        else:
            feed = {"hidden": hidden, "position_ids": positions, **{name: feed_dict[name] for name in self.streams}}
            feed.update((f"past_{name[8:]}", past) for name, past in zip(self.outputs[1:], self.presents, strict=True))
            out, *self.presents = self.session.run(list(self.outputs), feed)
            self.past += seq
            key, value = self.presents[:2]
        self.inference_time = time.perf_counter() - start
        extra = [] if self.in_place else list(zip(self.outputs[3:], self.presents[2:], strict=True))
        outputs = {"out": out, "present_key": key, "present_value": value, **dict(extra)}
        return OrderedDict(keep_last(outputs, self.kept).items() if self.kept else outputs.items())

    def deactivate_impl(self) -> None:
        del self.session


@dataclasses.dataclass
class DecodeReport(Verdict):
    """Result of :func:`validate_decode`: rows per step, graph and output against the eager block.

    Attributes:
        models: the graphs run (each a candidate).
        schedule: the steps, in order.
        rows: :class:`~posenc.validate.compare.ComparisonRow` per (step, graph, output); ``feed`` is the step.
        mode: ``numeric`` or ``bf16-emulated``.
    """

    models: list[str]
    schedule: list[Shape]
    rows: list[ComparisonRow]
    mode: str = "numeric"
    references: list[Reference] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "models": list(self.models),
            "schedule": [to_json(shape) for shape in self.schedule],
            "references": [ref.to_dict() for ref in self.references],
            "criterion": RULE,
            "mode": self.mode,
            "passed": self.passed,
            "rows": [row.to_dict() for row in self.rows],
        }

    def worst(self) -> dict[tuple[str, str, str], ComparisonRow]:
        """Per (reference, graph, output): the row of largest absolute error among those that count (among the
        informational ones where none counts)."""
        groups: dict[tuple[str, str, str], list[ComparisonRow]] = {}
        for row in self.rows:
            groups.setdefault((row.reference, row.runner, row.output), []).append(row)
        worst = {}
        for key, rows in groups.items():
            counted = [r for r in rows if not r.informational] or rows
            worst[key] = max(counted, key=lambda r: r.max_abs)
        return worst

    def to_markdown(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        steps = len(self.schedule)
        lines = [
            f"### Decode parity ({steps} steps) — {verdict}",
            "",
            f"Mode: {self.mode}. Steps (B, S, P @start): "
            + ", ".join(shape.label for shape in (self.schedule[0], self.schedule[-1]))
            + ". References, each carrying its own cache:",
            "",
            *[f"- `{ref.name}`: {ref.description}" for ref in self.references],
            "",
            f"Criterion: {RULE} Margin: the largest over the steps that count.",
            "",
            "| reference | graph | output | worst step | max abs error | atol | rtol | margin | steps passed | "
            "informational steps |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for (reference, runner, output), row in self.worst().items():
            rows = [r for r in self.rows if (r.reference, r.runner, r.output) == (reference, runner, output)]
            counted = [r for r in rows if not r.informational]
            passed = sum(1 for r in counted if r.passed)
            margin = max((r.margin for r in counted if r.margin is not None), default=None)
            lines.append(
                f"| {reference} | {runner} | {output} | {row.feed} ({row.shape.label if row.shape else ''}) | "
                f"{row.max_abs:.3e} | {row.atol:.1e} | {row.rtol:.1e} | {format_margin(margin)} | "
                f"{passed}/{len(counted)} | {len(rows) - len(counted)} |"
            )
        notes = list(dict.fromkeys(r.note for r in self.rows if r.note))
        if notes:
            lines += ["", *[f"- informational: {note}" for note in notes[:5]]]
        return "\n".join(lines) + "\n"


def validate_decode(
    paths: Sequence[str | os.PathLike[str]],
    schedule: Sequence[Shape] | None = None,
    *,
    jump: str = "position",
    seed: int = 0,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    tolerances: Mapping[str, Tolerance] | None = None,
    quiet: bool = True,
    references: Sequence[Reference] = (),
) -> DecodeReport:
    """Run a decode sequence through each graph on ONNX Runtime and compare every step with the eager block.

    Args:
        paths: exported or optimized ``block`` / ``block-inplace`` graphs of one block (the same weights, e.g. its
            concat and in-place exports); each is a candidate.
        schedule: the steps (default :func:`decode_schedule` at the graphs' :func:`serving_limit`).
        jump: the default schedule's long jump (``position`` or ``fill``).
        seed: seed of the new tokens and of the in-place caches' unwritten slots.
        providers: ONNX Runtime providers.
        tolerances: per-output overrides of the scheme's tolerances.
        quiet: silence polygraphy.
        references: more references, each carrying its own cache (:func:`stepping_runner`), e.g. the checkpoint's
            transformers module (:func:`posenc.validate.checkpoint.decode_against_checkpoint`).

    Raises:
        ConfigError: no graph, graphs of different blocks, a non-block graph, or a schedule that does not fit.
        ModelFileError: a missing or corrupt graph, manifest or weights.
    """
    if not paths:
        raise ConfigError("validate_decode needs at least one graph.")
    with contextlib.ExitStack() as held:
        for folder in dict.fromkeys(Path(path).parent for path in paths):
            held.enter_context(reading(folder))  # writers wait until the sequence has read every graph
        return _validate_decode(paths, schedule, jump, seed, providers, tolerances, quiet, references)


def _validate_decode(
    paths: Sequence[str | os.PathLike[str]],
    schedule: Sequence[Shape] | None,
    jump: str,
    seed: int,
    providers: Sequence[str],
    tolerances: Mapping[str, Tolerance] | None,
    quiet: bool,
    references: Sequence[Reference],
) -> DecodeReport:
    from posenc.validate.bf16 import prepare_for_ort

    manifests = []
    for path in paths:
        check_model_file(path)
        manifests.append(load_manifest(path))
    first = manifests[0]
    for path, manifest in zip(paths, manifests, strict=True):
        if manifest.weights.sha256 != first.weights.sha256 or manifest.dtype != first.dtype:
            raise ConfigError(
                f"{path} holds other weights or another dtype than {paths[0]}; decode parity compares graphs of one "
                f"block (its concat and in-place exports, optimized or not)."
            )
    rings = [slots for slots in map(ring_slots, manifests) if slots is not None]
    if schedule is None:
        # a graph that serves chunks over a filled cache one row at a time (shape rules) steps one row; a ring
        # cache steps over the positions, past its slots
        limit = min(serving_limit(m, ring_positions=True) for m in manifests)
        schedule = decode_schedule(limit, jump=jump)
        if any(fit_shapes(m, schedule) != schedule for m in manifests):
            schedule = decode_schedule(limit, jump=jump, batch=1)
    if rings:
        schedule = ring_schedule(schedule, min(rings), int(first.attention_config().sliding_window))
    schedule = list(schedule)
    kept = min(rings) if rings else None
    for path, manifest in zip(paths, manifests, strict=True):
        check_shapes(manifest, schedule, str(path))
    feeds = step_feeds(first, schedule, seed)
    reference = eager_decode_reference(paths[0], first)
    candidates = []
    mode = "numeric"
    for index, (path, manifest) in enumerate(zip(paths, manifests, strict=True)):
        prepared = prepare_for_ort(path, feeds[:1])
        mode = prepared.mode
        name = f"onnxrt-{index}:{Path(path).stem}"
        candidates.append(OrtDecodeRunner(prepared.model, manifest, schedule[0].batch, name, providers, seed, kept))
    carried = [{k: (v if np.asarray(v).dtype.kind in "iub" else np.asarray(v).astype(np.float32)) for k, v in f.items()}
               for f in feeds]  # fmt: skip  # bf16 emulated: every floating feed (hidden, streams) as float32
    feeds = carried if mode != "numeric" else feeds
    all_references = [reference, *references]
    if kept is not None:  # every reference's cache rows cut to what the ring holds
        for ref in all_references:
            step = ref.runner.fn
            ref.runner.fn = lambda feed, step=step: keep_last(step(feed), kept)
    for ref in all_references:
        ref.runner.input_metadata = feed_metadata(feeds[0])
    tols = tolerances_for(first.scheme, dict.fromkeys(decode_outputs(first), first.dtype), tolerances)
    comparison = compare(all_references, candidates, feeds, tols, shapes=schedule, quiet=quiet)
    return DecodeReport([str(p) for p in paths], schedule, comparison.rows, mode, all_references)


__all__ = [
    "DECODE_STEPS",
    "DecodeReport",
    "OrtDecodeRunner",
    "decode_outputs",
    "decode_schedule",
    "eager_decode_reference",
    "ring_schedule",
    "ring_slots",
    "serving_limit",
    "step_feeds",
    "stream_slots",
    "validate_decode",
]
