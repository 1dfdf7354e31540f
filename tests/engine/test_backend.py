"""Backend choice, targets and profiles (no engine is built here)."""

from __future__ import annotations

import types

import pytest

from posenc.engine import backend as backend_module
from posenc.engine.backend import Backend, load_backend
from posenc.engine.profiles import (
    DEFAULT_BATCH,
    DimProfile,
    format_profiles,
    input_shapes,
    parse_override,
    resolve_profile,
    resolve_profiles,
)
from posenc.engine.targets import normalize_target, resolve_targets, supported_targets
from posenc.errors import BackendUnavailable, ConfigError
from posenc.export.manifest import DimRange

DIMS = {"batch": DimRange(1, None, 2), "seq": DimRange(1, 64, 4), "past": DimRange(0, 63, 3)}


def test_missing_backend_says_what_to_install(monkeypatch) -> None:
    def no_module(name: str):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(backend_module, "_LOADED", {})
    monkeypatch.setattr(backend_module, "_import", no_module)
    with pytest.raises(BackendUnavailable) as info:
        load_backend()
    message = str(info.value)
    assert "pip install tensorrt-rtx-cu13" in message
    assert "pip install tensorrt" in message
    assert "tensorrt_rtx" in message
    assert "No module named" in message
    with pytest.raises(BackendUnavailable, match="pip install tensorrt-rtx-cu13"):
        load_backend("tensorrt_rtx")


def test_datacenter_tensorrt_is_preferred_when_importable(monkeypatch) -> None:
    fake = types.SimpleNamespace(__version__="11.4.0")
    monkeypatch.setattr(backend_module, "_LOADED", {})
    monkeypatch.setattr(backend_module, "_import", lambda name: fake if name == "tensorrt" else None)
    chosen = load_backend()
    assert chosen.name == "tensorrt"
    assert chosen.version == "11.4.0"
    assert chosen.has_timing_cache


def test_unknown_backend_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="tensorrt_rtx"):
        load_backend("onnxruntime")


@pytest.mark.parametrize(("text", "want"), [("sm89", "sm89"), ("SM_120", "sm120"), ("8.9", "sm89"), ("75", "sm75")])
def test_target_spellings(text: str, want: str) -> None:
    assert normalize_target(text) == want


def test_bad_target_spelling() -> None:
    with pytest.raises(ConfigError, match="like sm89"):
        normalize_target("ampere")


def test_rtx_rejects_hopper_and_lists_what_it_supports() -> None:
    rtx = pytest.importorskip("tensorrt_rtx", reason="tensorrt_rtx not installed (make setup installs it)")
    backend = Backend("tensorrt_rtx", rtx, rtx.__version__)
    supported = supported_targets(backend)
    assert {"sm75", "sm80", "sm86", "sm89", "sm120"} <= set(supported)
    assert "sm90" not in supported
    with pytest.raises(ConfigError) as info:
        resolve_targets(backend, ["sm89", "sm90"])
    assert "sm90" in str(info.value)
    assert "sm75, sm80, sm86, sm89, sm120" in str(info.value)
    assert resolve_targets(backend, ["8.9", "sm89", "sm120"]) == ["sm89", "sm120"]


def test_datacenter_tensorrt_builds_only_for_the_gpu_it_runs_on(monkeypatch) -> None:
    from posenc.engine import targets as targets_module

    backend = Backend("tensorrt", types.SimpleNamespace(), "11.4.0")
    monkeypatch.setattr(targets_module, "current_gpu_target", lambda: "sm90")
    assert resolve_targets(backend, None) == ["sm90"]
    with pytest.raises(ConfigError, match="supported targets: sm90"):
        resolve_targets(backend, ["sm89"])


def test_default_profile_covers_the_manifest_ranges() -> None:
    profile = resolve_profile(DIMS)
    assert profile["seq"] == DimProfile(1, 64, 64)
    assert profile["past"] == DimProfile(0, 0, 63)
    assert profile["batch"].min == 1
    assert profile["batch"].max >= 1


def test_profile_override_within_the_range_is_used() -> None:
    profile = resolve_profile(DIMS, ["seq=1:8:32", "batch=4"])
    assert profile["seq"] == DimProfile(1, 8, 32)
    assert profile["batch"] == DimProfile(4, 4, 4)


@pytest.mark.parametrize("override", ["seq=1:8:128", "past=0:0:64", "seq=0:1:8"])
def test_profile_outside_the_manifest_ranges_is_refused(override: str) -> None:
    with pytest.raises(ConfigError, match="outside the manifest's range"):
        resolve_profile(DIMS, [override])


@pytest.mark.parametrize("override", ["seq", "seq=1:2", "seq=8:4:16", "seq=a:b:c", "=1:2:3"])
def test_malformed_profile_is_refused(override: str) -> None:
    with pytest.raises(ConfigError, match=r"MIN:OPT:MAX|min <= opt <= max"):
        parse_override(override)


def test_unknown_profile_dimension_lists_the_model_dimensions() -> None:
    with pytest.raises(ConfigError, match=r"\['batch', 'past', 'seq'\]"):
        resolve_profile(DIMS, ["tokens=1:2:3"])


def test_input_without_a_range_for_its_dynamic_dim_is_refused() -> None:
    with pytest.raises(ConfigError, match="--profile n=MIN:OPT:MAX"):
        input_shapes([("x", ["n", 4])], {})
    assert input_shapes([("x", ["seq", 4])], {"seq": DimProfile(1, 2, 3)}) == {"x": ([1, 4], [2, 4], [3, 4])}


OPEN = {"batch": DimRange(1, None, 2), "seq": DimRange(1, None, 4), "past": DimRange(0, None, 3)}


def test_model_profiles_reach_the_context_of_a_dynamic_table_model() -> None:
    """A dynamic-table Llama-3.2-like block (131072 positions) is no longer capped at 2048: prefill serves every
    call up to the context, decode steps of 1-16 tokens after up to 131071 cached ones."""
    profiles = resolve_profiles(OPEN, context=131072, decoder=True)
    assert list(profiles) == ["prefill", "decode"]
    prefill, decode = profiles["prefill"], profiles["decode"]
    assert prefill["seq"] == DimProfile(1, 512, 131072)
    assert prefill["past"] == DimProfile(0, 0, 131071)
    assert decode["seq"] == DimProfile(1, 1, 16)
    assert decode["past"] == DimProfile(0, 4095, 131071)
    assert prefill["batch"] == decode["batch"] == DimProfile(1, 1, DEFAULT_BATCH)
    assert "prefill: batch 1:1:8, seq 1:512:131072, past 0:0:131071" in format_profiles(profiles)


def test_a_precomputed_table_bounds_the_profiles_and_overrides_apply_to_each() -> None:
    profiles = resolve_profiles(DIMS, ["batch=1:2:4"], context=131072, decoder=True)
    assert profiles["prefill"]["seq"] == DimProfile(1, 64, 64)  # the 64-row table, not the context
    assert profiles["decode"]["past"] == DimProfile(0, 63, 63)
    assert all(p["batch"] == DimProfile(1, 2, 4) for p in profiles.values())
    with pytest.raises(ConfigError, match="outside the manifest's range"):
        resolve_profiles(DIMS, ["seq=1:8:128"], context=131072, decoder=True)
    assert list(resolve_profiles(DIMS, context=4096, decoder=False)) == ["prefill"]
    assert list(resolve_profiles(DIMS)) == ["default"]  # no context known: the manifest's ranges, capped


@pytest.mark.parametrize("datacenter", [False, True])
def test_running_an_engine_without_a_gpu_says_what_it_needs(monkeypatch, tmp_path, datacenter: bool) -> None:
    """`validate --engine` here: with or without datacenter tensorrt, the remedy is a GPU and `tensorrt`, never
    "install TensorRT-RTX" (which builds engines but cannot run them)."""
    from posenc.engine import runner as runner_module
    from posenc.engine import targets as targets_module

    fake = types.SimpleNamespace(__version__="11.4.0")

    def importer(name: str):
        if name == "tensorrt" and datacenter:
            return fake
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(backend_module, "_LOADED", {})
    monkeypatch.setattr(backend_module, "_import", importer)
    monkeypatch.setattr(targets_module, "current_gpu_target", lambda: None)
    engine = tmp_path / "block.engine"
    engine.write_bytes(b"not run")
    with pytest.raises(BackendUnavailable) as info:
        runner_module.engine_runner(engine)
    message = str(info.value)
    assert "needs an NVIDIA GPU and datacenter `tensorrt`" in message
    assert "no NVIDIA GPU is visible here" in message
    assert ("datacenter tensorrt is not installed" in message) is not datacenter
    assert "install TensorRT-RTX" not in message
    assert "cannot run" in message
