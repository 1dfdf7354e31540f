"""Every sample checkpoint (one per family variant, `posenc.checkpoints.samples`), proven against its own
transformers module (see tests/checkpoints/parity.py).

Each case builds a tiny seeded checkpoint with transformers' config and model classes (``save_pretrained``),
exports one layer with ``posenc export --hf-model``, and compares ONNX Runtime's output with transformers' module
at short positions, decode steps with a cache, and positions near the context length, in its table modes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from posenc.checkpoints.samples import SAMPLES
from tests.checkpoints.parity import check_case, sample_case

pytest.importorskip("transformers")


SLOW = {
    "falcon-new-arch-alibi",
    "olmo2",
    "gpt-oss",
    "qwen3-next",
    "ministral3",
    "mistral4",
    "phi",
    "phi-plain",
    "persimmon",
    "modernbert-global",
    "lfm3",
}
"""Exported only in the slow run: falcon-new-arch-alibi's layout (falcon-new-arch-rope) and ALiBi form
(falcon-alibi-bias) are exported by other samples; tests/checkpoints/test_families_decoders.py still proves its
reference against the model. The samples of today's attention features (full-width q/k norms, sinks, output gates,
position-scaled queries, q/k LayerNorm) are proven in eager PyTorch against their modules and whole models in the
default run (tests/checkpoints/test_aliases.py, test_families_modern.py) and exported there as blocks with the same
options (tests/features.py); their CLI export through ONNX Runtime runs here in the slow run. ModernBERT's local
layer is exported here in the default run (bidirectional window, fused Wqkv, local theta); its global layer, the same
graph without the window, in the slow run (tests/checkpoints/test_modernbert.py proves both against their module and
whole model)."""


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(SAMPLES)])
def test_sample_layer_matches_its_transformers_module(name: str, export_cache: Path) -> None:
    case = sample_case(
        name, export_cache
    )  # built and exported once per session (tests/checkpoints/test_sample_targets.py optimizes them)
    assert check_case(case, case.folder.parent)  # check_case asserts every claim and returns the measured errors
