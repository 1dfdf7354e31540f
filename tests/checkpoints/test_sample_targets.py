"""Every sample checkpoint's layer optimized for each target and held to its own transformers module, as
``posenc demo`` does.

Per sample of :mod:`posenc.checkpoints.samples` (the tiny seeded checkpoints the demo uses; built and exported once
per test session, shared with tests/checkpoints/test_families.py): ``optimize`` for a target with the before/after
check on ONNX Runtime CPU (:func:`posenc.validate.check_ort_parity`, as ``posenc optimize`` and the demo run it), then
``validate --against-hf`` on the optimized graph (:func:`posenc.validate.checkpoint.validate_against_checkpoint`:
references ``eager-fp64``, ``hf-fp32`` and ``hf-fp64, fp64 angles``, with a feed ending at the context length).
The ``ort-cuda`` and ``trt`` graphs are graph rewrites here, run on ONNX Runtime CPU like every optimized graph the
repository checks without a GPU.

Default run: ``ort-cpu`` (the target with the most passes, and the one the demo validates) on the first table mode
of one sample per path through its passes (``TARGET_SAMPLES``). Marked ``slow``: ``ort-cuda`` and ``trt``, the other
table mode, and the other samples.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from posenc.checkpoints.samples import SAMPLES
from posenc.graphs import optimize_file
from posenc.graphs.choices import TARGETS
from posenc.validate import check_ort_parity
from tests.checkpoints.parity import export_layer, sample_case
from tests.checkpoints.test_families import SLOW

pytest.importorskip("transformers")

DEFAULT_TARGET = "ort-cpu"

TARGET_SAMPLES = {
    "llama": "RoPE, half rotation: fuse_rope, rope_to_3d, fused projections, GroupQueryAttention prefill",
    "gptj": "interleaved partial rotation",
    "llama4-rope": "complex RoPE, chunked attention mask, L2 q/k norm",
    "llama4-nope": "no positions, query scaled by position (attention temperature)",
    "qwen2-vl": "M-RoPE sections over three position axes, q/k/v biases",
    "qwen3-vl": "interleaved M-RoPE, q/k norms",
    "qwen3": "per-head q/k RMSNorm before the rotation",
    "hunyuan": "q/k norms after the rotation",
    "phi3-longrope": "LongRoPE's factor switch, fused qkv, partial rotation",
    "deepseek-v3": "multi-head latent attention (unequal head dims), rope_interleave",
    "falcon-multi-query-rope": "one kv head",
    "mistral-window": "causal sliding window",
    "modernbert-local": "bidirectional sliding window, fused Wqkv",
    "gemma2-softcap": "soft-cap on the scores",
    "bloom": "ALiBi added unscaled, fused qkv",
    "falcon-alibi-bias": "ALiBi scaled with the scores",
    "t5-decoder": "bucketed score bias, causal",
    "deberta-v2-shared": "a score bias that reads the keys (prefill declined)",
    "marian-decoder": "sinusoidal table at the embeddings, decode cache",
    "bert": "learned positions in the embedding step, no causal mask",
}
"""Samples optimized and validated in the default run: one per path through ``posenc optimize --target ort-cpu``
(the value says which). The other samples' layers take one of these paths with other constants or checkpoint
layouts (their export is proven against their module in tests/checkpoints/test_families.py in the default run);
their optimized graph is checked in the slow run."""


def _cases() -> list:
    cases = []
    for name in sorted(SAMPLES):
        for index, mode in enumerate(SAMPLES[name].table_modes):
            for target in TARGETS:
                default = target == DEFAULT_TARGET and index == 0 and name in TARGET_SAMPLES
                marks = () if default else (pytest.mark.slow,)
                cases.append(pytest.param(name, mode, target, marks=marks, id=f"{name}-{mode}-{target}"))
    return cases


@pytest.mark.parametrize(("name", "mode", "target"), _cases())
def test_the_optimized_layer_matches_its_transformers_module(
    name: str, mode: str, target: str, export_cache: Path, tmp_path: Path
) -> None:
    from posenc.validate.checkpoint import validate_against_checkpoint

    case = sample_case(name, export_cache)
    source = export_layer(case, case.folder.parent, mode)
    graph = tmp_path / f"{source.stem}.{target}.onnx"
    result = optimize_file(source, graph, target, check=check_ort_parity)
    assert result.parity is not None, "the optimized graph was not run on ONNX Runtime"
    report = validate_against_checkpoint(graph, case.folder)
    failed = [(row.reference, str(row.shape), row.output, f"{row.max_abs:.3g}") for row in report.failures()]
    assert report.passed, failed


def test_every_sample_and_target_is_in_the_matrix() -> None:
    ids = {param.id for param in _cases()}
    assert {f"{name}-{SAMPLES[name].table_modes[0]}-{target}" for name in SAMPLES for target in TARGETS} <= ids
    defaults = [param for param in _cases() if not param.marks]
    assert {param.values[0] for param in defaults} == set(TARGET_SAMPLES)
    assert set(TARGET_SAMPLES) <= set(SAMPLES) - SLOW
