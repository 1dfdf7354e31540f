"""Each sample's transformers reference equals its attention module as the whole transformers model drives it.

The references are what every real-checkpoint parity claim is made against (posenc.checkpoints.reference), so they
are checked against the model itself: the attention module's input and output are captured while the base model
runs a prompt and a decode step (tests/checkpoints/whole_model.py), and the reference, fed the same hidden states
and positions and carrying its own cache, must reproduce them. (GPT-NeoX, Falcon, BLOOM and MPT: the same check in
test_families_decoders.py; the embedding-step families' references include the model's own embedding modules.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from posenc.checkpoints import load_layer
from posenc.checkpoints.samples import SAMPLES
from tests.checkpoints.whole_model import model_steps, reference_error

pytest.importorskip("transformers")

ROTARY_AND_T5 = sorted(
    name
    for name, sample in SAMPLES.items()
    if sample.config_class.startswith(
        ("Llama", "Mistral", "Qwen", "Gemma", "Phi3", "GPTJ", "T5", "Deepseek", "HunYuan")
    )
)


@pytest.mark.parametrize("name", ROTARY_AND_T5)
def test_reference_calls_its_module_as_the_model_does(name: str, tmp_path: Path) -> None:
    sample = SAMPLES[name]
    folder = sample.build(tmp_path / "ckpt")
    loaded = load_layer(folder, sample.layer, sample.layer_type)
    steps = model_steps(folder, loaded.plan.layer, sample.layer_type)
    assert len(steps) == (2 if loaded.plan.decoder else 1)
    assert reference_error(loaded.reference(), steps) <= 1e-5
