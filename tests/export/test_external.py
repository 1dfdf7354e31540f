"""Weights stored once (posenc.export.external): a graph's initializers as external data inside the safetensors file
that holds the module's state, found by content, named after what they are, and read back as the state_dict."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from safetensors.torch import load_file

from posenc import AttentionConfig
from posenc.errors import ModelFileError
from posenc.export import export_scheme, make_feed, ort_session
from posenc.export.external import (
    LINK_MIN_BYTES,
    TRANSPOSED,
    link_existing,
    linked_bytes,
    read_state,
    rename_values,
    write_linked,
)

CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=512)


@pytest.fixture(scope="module", params=["float32", "float16"])
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp(f"ext-{request.param}")
    return export_scheme("rope", folder / "m.onnx", config=CONFIG, dtype=request.param)


def _outputs(path: Path, manifest) -> list[np.ndarray]:
    feed = make_feed(manifest, _shape())
    return ort_session(path).run(None, feed)


def _shape():
    from posenc.export import FeedShape

    return FeedShape(2, 5, 3)


def test_weights_and_tables_are_stored_once_and_the_graph_computes_the_same(exported, tmp_path: Path) -> None:
    state = read_state(load_file(str(exported.weights_path)))
    model = onnx.load(str(exported.path))
    linked = write_linked(model, state, tmp_path / "m.weights.safetensors", "m.weights.safetensors")
    onnx.save(linked, str(tmp_path / "m.onnx"))
    names = {init.name for init in linked.graph.initializer if init.data_location == onnx.TensorProto.EXTERNAL}
    assert names == {
        "q_proj.weight" + TRANSPOSED,
        "k_proj.weight" + TRANSPOSED,
        "v_proj.weight" + TRANSPOSED,
        "o_proj.weight" + TRANSPOSED,
        "scheme.angles.cos_table",
        "scheme.angles.sin_table",
    }
    table_and_weights = sum(t.numel() * t.element_size() for t in state.values())
    assert linked_bytes(linked) == table_and_weights  # everything big, once
    inline = [i for i in onnx.load(str(tmp_path / "m.onnx"), load_external_data=False).graph.initializer if i.raw_data]
    assert all(len(i.raw_data) < LINK_MIN_BYTES for i in inline)  # nothing large is left inside the graph
    for got, want in zip(
        _outputs(tmp_path / "m.onnx", exported.manifest), _outputs(exported.path, exported.manifest), strict=True
    ):
        np.testing.assert_array_equal(got, want)
    back = read_state(load_file(str(tmp_path / "m.weights.safetensors")))
    assert sorted(back) == sorted(state)
    assert all(torch.equal(back[key], state[key]) for key in state)


def test_an_inline_graph_is_pointed_into_an_existing_file(exported, tmp_path: Path) -> None:
    state = read_state(load_file(str(exported.weights_path)))
    write_linked(onnx.load(str(exported.path)), state, tmp_path / "m.weights.safetensors", "m.weights.safetensors")
    inline = onnx.load(str(exported.path))
    link_existing(inline, tmp_path / "m.weights.safetensors", "m.weights.safetensors")
    onnx.save(inline, str(tmp_path / "other.onnx"))
    assert linked_bytes(inline) == sum(t.numel() * t.element_size() for t in state.values())
    for got, want in zip(
        _outputs(tmp_path / "other.onnx", exported.manifest), _outputs(exported.path, exported.manifest), strict=True
    ):
        np.testing.assert_array_equal(got, want)


def test_a_rename_onto_a_name_in_use_is_refused(exported) -> None:
    model = onnx.load(str(exported.path))
    first, second = [init.name for init in model.graph.initializer][:2]
    with pytest.raises(ModelFileError, match="names are taken"):
        rename_values(model, {first: second})


def test_the_same_block_writes_the_same_weights_file(exported, tmp_path: Path) -> None:
    """The weights file's sha256 identifies a block's weights (decode parity compares it across exports), so
    writing it again gives the same bytes; safetensors wrote a two-key metadata map in a random order."""
    from posenc.artifacts.paths import sha256_file

    state = read_state(load_file(str(exported.weights_path)))
    digests = set()
    for i in range(8):
        write_linked(onnx.load(str(exported.path)), state, tmp_path / f"w{i}.safetensors", f"w{i}.safetensors")
        digests.add(sha256_file(tmp_path / f"w{i}.safetensors"))
    assert len(digests) == 1
