"""Shared fixtures and helpers of the posenc test suite."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from posenc.config import AttentionConfig
from posenc.process import use_batch_gc

if TYPE_CHECKING:
    from posenc.export import ExportResult

os.environ.setdefault("TRITON_INTERPRET", "1")
torch.set_num_threads(1)
use_batch_gc()  # a worker only runs batch jobs (posenc.process: about 15 % of its time)

# Geometry of the registry-driven matrices: small, grouped-query, head_dim 16, short context.
SMALL = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=64)

# The official ONNX RotaryEmbedding node tests (provenance in PROVENANCE.txt there), kept with the tests so a
# clean clone checks them too.
CONFORMANCE = Path(__file__).parent / "data" / "onnx_rotary_embedding"


def copy_export(result, folder: Path) -> Path:
    """Copy an export (model, manifest, weights) into ``folder`` and return the new model path."""
    for source in (result.path, result.manifest_path, result.weights_path):
        (folder / source.name).write_bytes(source.read_bytes())
    return folder / result.path.name


def private_export(model: Path, folder: Path | None) -> ExportResult:
    """The export ``model`` (model, manifest, weights) copied into ``folder``, so that a test that changes or corrupts
    its files leaves the shared export (the session's ``export_cache``, a module fixture's) intact; ``None``: the
    export itself, to read only."""
    from posenc.artifacts.files import manifest_path_for, weights_path_for
    from tests.matrix import result_of

    if folder is not None:
        for source in (model, manifest_path_for(model), weights_path_for(model)):
            (folder / source.name).write_bytes(source.read_bytes())
        model = folder / model.name
    return result_of(model)


def covers(*schemes: str) -> pytest.MarkDecorator:
    """Mark a test as a property test of these schemes (the registry check needs one per scheme)."""
    return pytest.mark.covers(*schemes)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "covers(*schemes): property test of these registered schemes")


def _gpu_missing() -> str | None:
    if not torch.cuda.is_available():
        return "needs an NVIDIA GPU (torch.cuda.is_available() is False); run scripts/gpu_check.py on a GPU machine"
    return None


def _tensorrt_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        return "needs datacenter TensorRT (`pip install tensorrt` on a GPU machine); tensorrt_rtx cannot run engines"
    return None


FIRST = ("tests/test_demo.py", "tests/test_readme.py", "tests/census/test_census_cli.py", "tests/bench/test_harness.py")
"""Modules whose tests take 10-25 s each: run first, so that the xdist workers do not finish the rest of the suite
and wait on one of them at the end (the order within each module is kept, so its module fixtures are made once)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu` and `trt` tests with the reason when this machine lacks the hardware or the package; the longest
    modules (:data:`FIRST`) first."""
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in FIRST)  # stable: False (first) before True
    reasons = {"gpu": _gpu_missing(), "trt": _tensorrt_missing()}
    for item in items:
        for marker, reason in reasons.items():
            if reason and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


def decode_in_steps(block: torch.nn.Module, x: torch.Tensor, prefill: int) -> torch.Tensor:
    """``block``'s outputs for ``x [B, S, E]``: a prefill of ``prefill`` tokens, then one token per step (KV cache)."""
    out, k, v = block(x[:, :prefill])
    pieces = [out]
    for t in range(prefill, x.shape[1]):
        step, k, v = block(x[:, t : t + 1], past_key=k, past_value=v)
        pieces.append(step)
    return torch.cat(pieces, dim=1)


@pytest.fixture
def small_config() -> AttentionConfig:
    return SMALL


@pytest.fixture(scope="session")
def export_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder of exported graphs for the whole test session, shared by the xdist workers.

    :func:`tests.matrix.exported` locks each file while exporting, so every (scheme, table mode,
    dtype, unit, case) is exported once and reused by the parity, fusion and engine matrices.
    """
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = root / "posenc-exports"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def shared_export(export_cache: Path, name: str, scheme: str, **keywords: Any) -> ExportResult:
    """``export_scheme(scheme, **keywords)`` exported once for the session as ``<export_cache>/<name>/m.onnx`` and
    shared by the xdist workers (``name`` must say everything ``keywords`` choose). Tests read it; one that changes
    its files changes a copy (:func:`private_export`)."""
    from posenc.export import export_scheme
    from tests.matrix import locked

    path = export_cache / name / "m.onnx"  # the manifest names its weights file: m.weights.safetensors
    with locked(path):
        if not path.exists():
            export_scheme(scheme, path, **keywords)
    return private_export(path, None)


DECODE = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=96)
"""Geometry of the decode tests: 96 positions, room for a prefill, 64 single steps and a jump."""


@pytest.fixture(scope="session")
def rope_op16(export_cache: Path) -> ExportResult:
    """The RoPE op of :data:`SMALL` with a 16-row table (position guard on: the export default)."""
    return shared_export(export_cache, "rope_op_rows16", "rope", unit="op", config=SMALL, max_positions=16)


@pytest.fixture(scope="session")
def rope_inplace96(export_cache: Path) -> ExportResult:
    """The RoPE block with an in-place cache, :data:`DECODE` geometry."""
    return shared_export(export_cache, "rope_inplace96", "rope", kv_cache="inplace", config=DECODE)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
