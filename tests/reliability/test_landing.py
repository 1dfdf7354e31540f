"""Artifacts land as a unit (posenc.artifacts.files.atomic_outputs): a writer killed at any instant, or several
writers at once, leave the old complete artifact or the new complete one, and nothing else a user sees.

The writers are forked children (no interpreter start-up per kill) that re-land a real exported model as new
"generations": the model and weights bytes change, and the manifest records their sha256, as an export does. The
reader is posenc's own :func:`posenc.export.manifest.load_manifest`, which verifies both hashes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from posenc.artifacts import files
from posenc.export import ExportResult
from posenc.export.manifest import Manifest, load_manifest
from tests.conftest import private_export

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")


@pytest.fixture(scope="module")
def template(rope_op16: ExportResult) -> tuple[bytes, bytes, Manifest]:
    """The bytes of a real export (model, weights) and its manifest."""
    return rope_op16.path.read_bytes(), rope_op16.weights_path.read_bytes(), rope_op16.manifest


def write_generation(model: Path, template: tuple[bytes, bytes, Manifest], generation: int) -> None:
    """Land generation ``generation``: model, weights and manifest through one ``atomic_outputs``."""
    onnx_bytes, weights_bytes, manifest = template
    tag = f"generation {generation}".encode()
    onnx_bytes, weights_bytes = onnx_bytes + tag, weights_bytes + tag  # trailing bytes: only the hashes matter here
    weights = dataclasses.replace(manifest.weights, sha256=hashlib.sha256(weights_bytes).hexdigest())
    new = dataclasses.replace(manifest, onnx_sha256=hashlib.sha256(onnx_bytes).hexdigest(), weights=weights)
    paths = (model, files.weights_path_for(model), files.manifest_path_for(model))
    with files.atomic_outputs(*paths) as (tmp_model, tmp_weights, tmp_manifest):
        tmp_model.write_bytes(onnx_bytes)
        tmp_weights.write_bytes(weights_bytes)
        tmp_manifest.write_text(files.json_text(new.to_dict()), encoding="utf-8")


def generation_of(model: Path, template: tuple[bytes, bytes, Manifest]) -> int:
    """The generation the folder holds, read through posenc's reader (which verifies every hash)."""
    with files.reading(model):  # what a reader holds while it reads the files together
        manifest = load_manifest(model)  # raises ModelFileError on any mismatch
        data = model.read_bytes()
    assert manifest.onnx_sha256 == hashlib.sha256(data).hexdigest()
    return int(data[len(template[0]) :].decode().split()[1])


def visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def fork(body) -> int:
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            body()
        except BaseException:
            code = 1
        os._exit(code)
    return pid


def wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def killed_at_replace(step: int, action) -> None:
    """Run ``action`` with ``os.replace`` killing the process (SIGKILL) instead of its ``step``-th call (1-based)."""
    real = os.replace
    calls = [0]

    def replace(src, dst):
        calls[0] += 1
        if calls[0] == step:
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)

    os.replace = replace
    try:
        action()
    finally:
        os.replace = real


# The renames of one landing of three files: 1 the journal, 2 the manifest, 3 the weights, 4 the model; a kill
# "at step 5" comes after the last rename (the journal is still there).
@pytest.mark.parametrize("step", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("had_old", [True, False], ids=["overwrite", "new"])
def test_a_writer_killed_at_every_rename_step_leaves_one_complete_artifact(template, tmp_path, step, had_old) -> None:
    model = tmp_path / "m.onnx"
    if had_old:
        write_generation(model, template, 1)

    def body() -> None:
        if step == 5:
            real_unlink = Path.unlink

            def unlink(self: Path, missing_ok: bool = False) -> None:
                if self.name.startswith(f"{files.STAGING_MARK}commit-"):
                    os.kill(os.getpid(), signal.SIGKILL)
                real_unlink(self, missing_ok=missing_ok)

            Path.unlink = unlink
            write_generation(model, template, 2)
        else:
            killed_at_replace(step, lambda: write_generation(model, template, 2))

    assert wait(fork(body)) == -signal.SIGKILL
    if step == 1 and not had_old:  # killed before the journal: nothing landed, only staging
        assert not model.exists()
        files.settle(model)  # what the next run (writer or reader) does first
    else:
        expected = 1 if step == 1 else 2  # the journal landed: the new artifact is finished by the reader
        assert generation_of(model, template) == expected
    assert visible(tmp_path) == (
        [] if step == 1 and not had_old else ["m.manifest.json", "m.onnx", "m.weights.safetensors"]
    )


@pytest.mark.parametrize("seed", range(4))
def test_a_writer_killed_at_a_random_time_leaves_one_complete_artifact(template, tmp_path, seed) -> None:
    model = tmp_path / "m.onnx"
    write_generation(model, template, 0)

    def body() -> None:
        for generation in range(1, 10_000):
            write_generation(model, template, generation)

    pid = fork(body)
    time.sleep(random.Random(seed).uniform(0.01, 0.2))
    os.kill(pid, signal.SIGKILL)
    assert wait(pid) == -signal.SIGKILL
    assert generation_of(model, template) >= 0
    assert visible(tmp_path) == ["m.manifest.json", "m.onnx", "m.weights.safetensors"]


def test_concurrent_writers_take_turns(template, tmp_path) -> None:
    model = tmp_path / "m.onnx"

    def writer(offset: int):
        return lambda: [write_generation(model, template, offset + g) for g in range(15)]

    running = {fork(writer(100 * w)) for w in range(1, 4)}
    codes = []
    while running:
        if model.exists():
            generation_of(model, template)  # a reader meanwhile always sees a complete artifact
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                running.discard(pid)
                codes.append(os.waitstatus_to_exitcode(status))
    assert codes == [0, 0, 0]
    assert generation_of(model, template) % 100 == 14  # someone's last generation
    assert visible(tmp_path) == ["m.manifest.json", "m.onnx", "m.weights.safetensors"]


def test_stale_staging_of_a_dead_writer_is_removed_by_the_next_writer(template, tmp_path) -> None:
    model = tmp_path / "m.onnx"
    write_generation(model, template, 1)
    stale = tmp_path / f".m.onnx{files.STAGING_MARK}99999-dead.tmp"
    stale.write_bytes(b"half")
    write_generation(model, template, 2)
    assert generation_of(model, template) == 2
    assert visible(tmp_path) == ["m.manifest.json", "m.onnx", "m.weights.safetensors"]


def test_a_reader_refuses_a_model_its_manifest_does_not_describe(template, tmp_path) -> None:
    from posenc.errors import ModelFileError

    model = tmp_path / "m.onnx"
    write_generation(model, template, 1)
    old_manifest = files.manifest_path_for(model).read_bytes()
    write_generation(model, template, 2)
    files.manifest_path_for(model).write_bytes(old_manifest)  # an old manifest beside a new model
    with pytest.raises(ModelFileError, match="does not match its manifest"):
        load_manifest(model)


def test_a_validation_keeps_writers_out_until_it_has_read_everything(rope_op16, tmp_path) -> None:
    """validate checks the hashes and then reads the files again (ONNX Runtime, the eager rebuild): a writer landing
    in between made it report MISMATCH. The folder's shared lock is now held for the whole comparison, so a writer's
    exclusive lock is refused while a reference runs, and granted after."""
    import fcntl
    import threading

    from posenc.validate import Reference, TorchModuleRunner, validate_onnx
    from posenc.validate.parity import EAGER

    copy = private_export(rope_op16.path, tmp_path)
    model, manifest = copy.path, copy.manifest
    seen: list[bool] = []

    def writer_can_lock() -> bool:
        fd = os.open(tmp_path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    def probe(feed):  # runs inside the comparison, like any reference
        result: list[bool] = []
        thread = threading.Thread(target=lambda: result.append(writer_can_lock()))  # another writer, another thread
        thread.start()
        thread.join()
        seen.append(result[0])
        return {name: np.zeros(1) for name in manifest.output_names}

    watcher = Reference(TorchModuleRunner(probe, "writer-probe"), "is a writer locked out", informational=True)
    validate_onnx(model, references=[EAGER, watcher])
    assert seen
    assert not any(seen)  # locked out on every feed
    assert writer_can_lock()  # and free again afterwards
