"""Family parity harness: export a checkpoint's layer through the CLI, run it on ONNX Runtime, and compare it with
the checkpoint's own transformers attention module (computed here with plain numpy, independently of posenc's
comparison code).

Claims checked, per table mode:
- short positions (prefill, and for decoders a decode step and a prefill after a cache): ONNX Runtime fp32 output
  within 1e-5 of transformers' module (fp32, its own angles);
- positions near the context length: within 1e-5 of the same module fed float64 angles, and within
  transformers' own fp32-angle error (|module fp32 - module float64|) + 1e-5 of the module with its own angles.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from posenc.blocks import AttentionBlock
from posenc.checkpoints import load_layer
from posenc.checkpoints.load import load_state
from posenc.checkpoints.samples import get_sample
from posenc.cli import main
from posenc.export import FeedShape, load_manifest, make_feed, ort_session, run_onnx
from tests.matrix import locked

ATOL = 1e-5


@dataclasses.dataclass(frozen=True)
class Case:
    """One checkpoint layer to prove: where it is and what to check."""

    folder: Path
    layer: int | None = 0
    layer_type: str | None = None
    table_modes: tuple[str, ...] = ("precomputed", "dynamic")
    long: bool = True
    """Check positions near the context length (rotary and bias schemes; learned tables stop at their end)."""


SHORT = (FeedShape(2, 7, 0),)
DECODE = (FeedShape(2, 1, 9), FeedShape(1, 5, 4))


def _torch_inputs(feed: dict[str, np.ndarray]) -> list[torch.Tensor]:
    return [
        torch.from_numpy(np.ascontiguousarray(feed[name]))
        for name in ("hidden", "position_ids", "past_key", "past_value")
    ]


def _errors(got: dict[str, np.ndarray], want: tuple[torch.Tensor, ...]) -> dict[str, float]:
    names = ("out", "present_key", "present_value")
    return {
        n: float(np.abs(got[n].astype(np.float64) - w.double().numpy()).max()) for n, w in zip(names, want, strict=True)
    }


def sample_case(name: str, cache: Path) -> Case:
    """The case of sample checkpoint ``name``, built once per test session into ``cache`` (the session's shared
    export folder; parallel workers wait for each other's build)."""
    sample = get_sample(name)
    folder = cache / "samples" / name / "checkpoint"
    with locked(folder.with_suffix(".built")):
        if not folder.with_suffix(".built").exists():
            sample.build(folder)
            folder.with_suffix(".built").write_text("built\n")
    return Case(folder, sample.layer, sample.layer_type, sample.table_modes, sample.long)


def export_layer(case: Case, folder: Path, table_mode: str) -> Path:
    """``posenc export --hf-model`` of the case's layer into ``folder`` (once: later calls, from any worker, reuse
    the file); asserts the CLI succeeded."""
    out = folder / f"{case.layer_type or 'layer'}{case.layer}-{table_mode}.onnx"
    with locked(out):
        if not out.exists():
            _export(case, out, table_mode)
    return out


def _export(case: Case, out: Path, table_mode: str) -> None:
    args = ["export", "--hf-model", str(case.folder), "--table-mode", table_mode, "-o", str(out)]
    if case.layer is not None:
        args += ["--layer", str(case.layer)]
    if case.layer_type:
        args += ["--layer-type", case.layer_type]
    assert main(args) == 0


def long_feed(manifest, batch: int, seq: int, end: int, seed: int = 5) -> dict[str, np.ndarray]:
    """Positions ``end - seq .. end - 1``, no cache (multi-axis ids: the vision-like layout shifted there)."""
    return make_feed(manifest, FeedShape(batch, seq, 0, start=end - seq), seed=seed)


def check_case(case: Case, folder: Path) -> dict[str, dict[str, float]]:
    """Run every claim of the module docstring for ``case`` (its layer exported into ``folder``); returns the
    measured errors by check."""
    loaded = load_layer(case.folder, case.layer, case.layer_type)
    native = loaded.reference("native", torch.float32)
    exact = loaded.reference("float64", torch.float64)
    measured: dict[str, dict[str, float]] = {}
    for mode in case.table_modes:
        path = export_layer(case, folder, mode)
        manifest = load_manifest(path)
        assert manifest.weights.source.kind == "checkpoint"
        session = ort_session(path)
        shapes = SHORT + (DECODE if loaded.plan.decoder else ())
        for shape in shapes:
            feed = make_feed(manifest, shape, seed=shape.seq + shape.past)
            errors = _errors(run_onnx(path, feed, manifest=manifest, session=session), native(*_torch_inputs(feed)))
            measured[f"{mode} {shape.label}"] = errors
            assert max(errors.values()) <= ATOL, (mode, shape, errors)
        if case.long:
            end = loaded.plan.config.max_position_embeddings
            feed = long_feed(manifest, 2, 4, end)
            got = run_onnx(path, feed, manifest=manifest, session=session)
            inputs = _torch_inputs(feed)
            vs_exact = _errors(got, exact(*inputs))
            assert max(vs_exact.values()) <= ATOL, (mode, "long vs float64 angles", vs_exact)
            own = native(*inputs)
            fp32_angles = _errors(
                {n: o.double().numpy() for n, o in zip(("out", "present_key", "present_value"), own, strict=True)},
                exact(*inputs),
            )
            vs_native = _errors(got, own)
            for name, error in vs_native.items():
                assert error <= fp32_angles[name] + ATOL, (mode, name, error, fp32_angles[name])
            measured[f"{mode} long vs fp64 angles"] = vs_exact
            measured[f"{mode} long vs own angles"] = vs_native
    return measured


def block_errors(loaded, seed: int = 1) -> dict[str, float]:
    """posenc's float32 block against the layer's transformers module, in eager PyTorch (no export).

    Largest |difference| over every output of: a 7-token prompt at positions 0..6 and at 100..106 and (decoder
    layers) a decode step over a 9-token cache (the block's own presents of a prompt), against the module with its
    own angles; 4 tokens ending at the context length, against the module in float64 fed float64 angles (its float32
    angles drift)."""
    block, native = loaded.block(), loaded.reference("native", torch.float32)
    exact = loaded.reference("float64", torch.float64)
    config = loaded.plan.config
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 7, config.hidden_size, generator=generator)
    with torch.no_grad():  # a cache of 9 tokens in the layout the block (and module) keep, whatever the geometry
        past = block(torch.randn(2, 9, config.hidden_size, generator=generator))[1:]
    end = config.max_position_embeddings
    feeds = {
        "prompt": (hidden, torch.arange(7).expand(2, 7), None, None),
        "prompt at 100": (hidden, torch.arange(100, 107).expand(2, 7), None, None),
        "decode step": (hidden[:, :1], torch.full((2, 1), 9), *past),
        "near the context length": (hidden[:, :4], torch.arange(end - 4, end).expand(2, 4), None, None),
    }
    if not loaded.plan.decoder:  # an encoder's layer (ModernBERT) takes no cache
        del feeds["decode step"]
    axes = block.scheme.spec.position_axes  # M-RoPE: text tokens carry the same id on every axis
    errors = {}
    for name, (x, ids, *cache) in feeds.items():
        feed = (x, ids.expand(axes, *ids.shape) if axes > 1 else ids, *cache)
        reference = exact if name == "near the context length" else native
        with torch.no_grad():
            ours = block(*feed)
        theirs = reference(*feed)
        errors[name] = max(float((a.double() - b.double()).abs().max()) for a, b in zip(ours, theirs, strict=True))
    return errors


def changed_block_error(loaded, **changes) -> float:
    """Max |block - module| of the output at positions 100..106, the block built with ``changes`` to its scheme
    params (``rope_theta``) or geometry (``sliding_window``, ``v_norm``, ...): how far a block that left a feature out
    (or got it wrong) is from the layer's own module, so a test can show its parity check would catch that."""
    plan = loaded.plan
    params = {**plan.params, **{k: v for k, v in changes.items() if k in plan.params}}
    config = dataclasses.replace(plan.attention, **{k: v for k, v in changes.items() if k not in plan.params})
    block = AttentionBlock(config, plan.scheme, params).eval()
    load_state(block, loaded.state, loaded.location)
    hidden = torch.randn(2, 7, config.hidden_size, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(100, 107).expand(2, 7)
    with torch.no_grad():
        got = block(hidden, positions)[0]
    return float((got - loaded.reference()(hidden, positions)[0]).abs().max())
