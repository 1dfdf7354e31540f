"""Every sample checkpoint's layer optimized for each target and held to its own transformers module, as
``posenc demo`` does.

Per sample of :mod:`posenc.checkpoints.samples` (the tiny seeded checkpoints the demo uses; built and exported once
per test session, shared with tests/checkpoints/test_families.py): ``optimize`` for a target with the before/after
check on ONNX Runtime CPU (:func:`posenc.validate.check_ort_parity`, as ``posenc optimize`` and the demo run it), then
``validate --against-hf`` on the optimized graph (:func:`posenc.validate.checkpoint.validate_against_checkpoint`:
references ``eager-fp64``, ``hf-fp32`` and ``hf-fp64, fp64 angles``, with a feed ending at the context length).
The ``ort-cuda`` and ``trt`` graphs are graph rewrites here, run on ONNX Runtime CPU like every optimized graph the
repository checks without a GPU.

Default run: ``ort-cpu`` (the target with the most passes, and the one the demo validates) on each sample's first
table mode. Marked ``slow``: ``ort-cuda`` and ``trt``, the other table mode, and the samples test_families.py keeps
for its slow run.
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


def _cases() -> list:
    cases = []
    for name in sorted(SAMPLES):
        for index, mode in enumerate(SAMPLES[name].table_modes):
            for target in TARGETS:
                default = target == DEFAULT_TARGET and index == 0 and name not in SLOW
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
    assert {param.values[0] for param in defaults} == set(SAMPLES) - SLOW
