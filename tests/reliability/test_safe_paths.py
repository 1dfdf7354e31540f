"""One safe-path rule for every file a model or manifest names (posenc.artifacts.paths.member): inside the model's
folder, a regular file, no symlink out, its sha256 checked before it is read or copied; outputs follow the umask.

Each case read or copied a file outside the model's folder (or a tampered one) before the rule existed."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from posenc.artifacts.files import manifest_path_for
from posenc.artifacts.paths import member, umask
from posenc.errors import ModelFileError
from posenc.export.manifest import load_manifest
from posenc.export.runtime import check_model_file
from posenc.graphs import optimize_file
from tests.conftest import copy_export

SECRET = b"secret bytes outside the model's folder"


@pytest.fixture
def exported(rope_op16):
    return rope_op16  # each test copies it (copy_model)


def copy_model(exported, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(SECRET)
    return copy_export(exported, folder)


def name_weights(model: Path, name: str) -> None:
    manifest = manifest_path_for(model)
    data = json.loads(manifest.read_text())
    data["weights"]["path"] = name
    manifest.write_text(json.dumps(data))


def nothing_has_the_secret(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert SECRET not in path.read_bytes(), f"{path} holds bytes read from outside the model's folder"


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_weights_named_outside_the_folder_are_never_read_or_copied(exported, tmp_path, how) -> None:
    model = copy_model(exported, tmp_path)
    secret = tmp_path / "secret.bin"
    if how == "dotdot":
        name_weights(model, "../secret.bin")
    elif how == "absolute":
        name_weights(model, str(secret))
    else:
        weights = model.parent / exported.weights_path.name
        weights.unlink()
        weights.symlink_to(secret)
    with pytest.raises(ModelFileError, match=r"outside|leads out|absolute"):
        load_manifest(model)
    with pytest.raises(ModelFileError, match=r"outside|leads out|absolute"):
        optimize_file(model, model.parent / "o.onnx", "trt")
    assert not (model.parent / "o.onnx").exists()
    nothing_has_the_secret(model.parent)


def test_tampered_weights_are_refused_before_they_are_copied(exported, tmp_path) -> None:
    model = copy_model(exported, tmp_path)
    weights = model.parent / exported.weights_path.name
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ModelFileError, match="sha256"):
        optimize_file(model, model.parent / "o.onnx", "trt")
    assert sorted(p.name for p in model.parent.iterdir()) == sorted(
        p.name for p in (exported.path, exported.manifest_path, exported.weights_path)
    )


def external_model(tmp_path: Path, how: str) -> Path:
    """A model whose initializer ``w`` is stored as external data that leads out of its folder."""
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (tmp_path / "secret.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    tensor = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    location = {"dotdot": "../secret.bin", "absolute": str(tmp_path / "secret.bin"), "symlink": "data.bin"}[how]
    if how == "symlink":
        (folder / "data.bin").symlink_to(tmp_path / "secret.bin")
    tensor.external_data.add(key="location", value=location)
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [tensor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = folder / "ext.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_external_data_outside_the_folder_is_refused_by_every_reader(tmp_path, capsys, how) -> None:
    from posenc.cli import main

    path = external_model(tmp_path, how)
    with pytest.raises(ModelFileError, match=r"leads out|absolute"):
        check_model_file(path)
    for argv in (
        ["inspect", path, "--no-tensorrt"],
        ["optimize", path, "--target", "trt", "-o", path.parent / "o.onnx"],
    ):
        assert main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert "leads out" in err or "absolute" in err, err
    assert not (path.parent / "o.onnx").exists()


def test_member_accepts_files_inside_and_checks_their_hash(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.bin").write_bytes(b"abc")
    import hashlib

    digest = hashlib.sha256(b"abc").hexdigest()
    assert member(tmp_path, "sub/w.bin", "weights", sha256=digest) == tmp_path / "sub" / "w.bin"
    with pytest.raises(ModelFileError, match="sha256"):
        member(tmp_path, "sub/w.bin", "weights", sha256="0" * 64)
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ModelFileError, match="FIFO"):
        member(tmp_path, "pipe", "weights")


def test_outputs_follow_the_umask(exported, tmp_path) -> None:
    mask = os.umask(0o027)
    try:
        out = tmp_path / "o.onnx"
        optimize_file(exported.path, out, "trt")
        written = [p for p in tmp_path.iterdir() if p.is_file()]
        assert len(written) == 3  # model, manifest, the weights copied beside it
        for path in written:
            assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~0o027, path
    finally:
        os.umask(mask)
    assert umask() == mask


def test_a_checkpoint_shard_linked_out_of_its_folder_is_refused(tmp_path) -> None:
    from posenc.checkpoints.source import CheckpointSource
    from tests.checkpoints.tiny import llama

    folder = llama(tmp_path / "ckpt")
    weights = sorted(folder.glob("*.safetensors"))[0]
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(weights, outside)
    weights.symlink_to(outside)
    with pytest.raises(ModelFileError, match="outside"):
        CheckpointSource.from_folder(folder)
