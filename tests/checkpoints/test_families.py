"""Every sample checkpoint (one per family variant, `posenc.checkpoints.samples`), proven against its own
transformers module (see tests/checkpoints/parity.py).

Each case builds a tiny seeded checkpoint with transformers' config and model classes (``save_pretrained``),
exports one layer with ``posenc export --hf-model``, and compares ONNX Runtime's output with transformers' module
at short positions, decode steps with a cache, and positions near the context length, in its table modes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from posenc.checkpoints.samples import ALIAS_SAMPLES, SAMPLES
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
    "gemma4-sliding",
    "gemma4-full",
    "mimo-v2-flash-sliding",
    "mimo-v2-flash-full",
    *ALIAS_SAMPLES,
}
"""Exported only in the slow run: falcon-new-arch-alibi's layout (falcon-new-arch-rope) and ALiBi form
(falcon-alibi-bias) are exported by other samples; tests/checkpoints/test_families_decoders.py still proves its
reference against the model. The samples of today's attention features (full-width q/k norms, sinks, output gates,
position-scaled queries, q/k LayerNorm) are proven in eager PyTorch against their modules and whole models in the
default run (tests/checkpoints/test_aliases.py, test_families_modern.py) and exported there as blocks with the same
options (tests/features.py); their CLI export through ONNX Runtime runs here in the slow run. ModernBERT's local
layer is exported here in the default run (bidirectional window, fused Wqkv, local theta); its global layer, the same
graph without the window, in the slow run (tests/checkpoints/test_modernbert.py proves both against their module and
whole model). Gemma 4's layers are proven in eager PyTorch against their module and whole model in the default run
(tests/checkpoints/test_gemma4.py, which also exports and fuses the full layer); their CLI export runs here in the
slow run. MiMo-V2-Flash's layers likewise (tests/checkpoints/test_mimo.py, which also exports the sliding layer
through the CLI and validates it against its module). The alias samples (:data:`ALIAS_SAMPLES`: a family's attention
under another model type) are proven against their own modules and whole models in the default run
(tests/checkpoints/test_aliases.py, from the same recipes); their CLI export runs here in the slow run."""


BOTH_MODES = {
    "llama",  # rope (half rotation)
    "gptj",  # rope, interleaved partial rotation
    "llama4-rope",  # complex rope
    "qwen2-yarn",  # YaRN: the dynamic graph multiplies by the attention factor
    "phi3-longrope",  # LongRoPE: short/long factors picked in the graph
    "qwen2-vl",  # M-RoPE: sections over three position axes
    "deepseek-v3",  # multi-head latent attention, YaRN mscale
    "bloom",  # ALiBi slopes
    "t5-decoder",  # T5 buckets, with a decode cache
    "deberta-v2-shared",  # DeBERTa log buckets, c2p+p2c
    "marian-decoder",  # sinusoidal table
}
"""Samples whose second table mode (``dynamic``: the graph computes its tables) runs in the default run: one per way
of computing the tables in the graph. The other samples' second table mode computes its tables the same way as one of
these (same scheme and rotation layout, other constants or attention options that do not depend on the table mode:
windows, soft caps, q/k norms, biases), so it runs in the slow run only; their first table mode stays here."""


def _cases() -> list:
    cases = []
    for name in sorted(SAMPLES):
        for index, mode in enumerate(SAMPLES[name].table_modes):
            slow = name in SLOW or (index > 0 and name not in BOTH_MODES)
            cases.append(pytest.param(name, mode, marks=[pytest.mark.slow] if slow else [], id=f"{name}-{mode}"))
    return cases


@pytest.mark.parametrize(("name", "mode"), _cases())
def test_sample_layer_matches_its_transformers_module(name: str, mode: str, export_cache: Path) -> None:
    case = sample_case(
        name, export_cache
    )  # built and exported once per session (tests/checkpoints/test_sample_targets.py optimizes them)
    case = dataclasses.replace(case, table_modes=(mode,))
    assert check_case(case, case.folder.parent)  # check_case asserts every claim and returns the measured errors


def test_every_sample_and_table_mode_is_in_the_matrix() -> None:
    assert set(SAMPLES) - SLOW >= BOTH_MODES
    ids = {param.id for param in _cases()}
    assert ids == {f"{name}-{mode}" for name, sample in SAMPLES.items() for mode in sample.table_modes}
    assert {param.values[0] for param in _cases() if not param.marks} == set(SAMPLES) - SLOW
