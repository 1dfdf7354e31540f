"""The census's reading of an export's path from its manifest: family / alias / tower from the checkpoint
provenance, trace from a trace record or an explicit field, and "unknown" (never a crash) for anything else."""

from __future__ import annotations

import dataclasses

import pytest

from posenc.census import route
from posenc.census.route import classify
from posenc.checkpoints import family as family_module


def _manifest(family: str, model_type: str, **extra: object) -> dict[str, object]:
    source = {"kind": "checkpoint", "family": family, "model_type": model_type, "layer": 0, "tensors": {}}
    return {"scheme": "rope", "weights": {"source": source}, **extra}


def test_a_type_its_family_lists_is_family() -> None:
    assert classify(_manifest("llama", "mistral"), "mistral") == route.Route("family", "llama")


def test_a_wrapper_loaded_through_its_text_types_family_is_a_tower() -> None:
    assert classify(_manifest("llama", "llava"), "llava", "llama").path == "tower"
    # A family built for the wrapper itself (Qwen2-VL's text config has no family of its own) stays "family".
    assert classify(_manifest("qwen_vl", "qwen2_vl"), "qwen2_vl", "qwen2_vl_text").path == "family"


def test_a_type_a_family_lists_as_an_alias_is_an_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    llama = next(f for f in family_module.all_families() if f.name == "llama")

    @dataclasses.dataclass(frozen=True)
    class WithAliases(family_module.Family):
        aliases: tuple[str, ...] = ()

    fake = WithAliases(**{f.name: getattr(llama, f.name) for f in dataclasses.fields(llama)}, aliases=("starcoder2",))
    monkeypatch.setattr(family_module, "all_families", lambda: [fake])
    assert classify(_manifest("llama", "starcoder2"), "starcoder2").path == "alias"
    assert classify(_manifest("llama", "llama"), "llama").path == "family"


def test_a_trace_record_is_a_trace_with_what_it_kept_and_replaced() -> None:
    manifest = _manifest(
        "",
        "gpt_oss",
        trace={
            "replaced": ["rotary cos/sin -> posenc tables (yarn)"],
            "kept": [{"what": "attention sinks", "reason": "no posenc part"}, "learned bias"],
        },
    )
    found = classify(manifest, "gpt_oss")
    assert found.path == "trace"
    assert found.kept == ("attention sinks: no posenc part", "learned bias")
    assert found.replaced == ("rotary cos/sin -> posenc tables (yarn)",)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"via": "trace"}, "trace"),
        ({"path": "Tower"}, "tower"),
        ({"weights": {"source": {"kind": "traced", "model_type": "phi"}}}, "trace"),
        ({"via": "somewhere else"}, "family"),  # not a path name: the provenance decides
    ],
)
def test_an_explicit_path_field_wins(extra: dict[str, object], expected: str) -> None:
    manifest = {**_manifest("llama", "llama"), **extra}
    assert classify(manifest, "llama").path == expected


@pytest.mark.parametrize(
    "manifest",
    [
        {},
        {"weights": {"source": {"kind": "random", "seed": 0}}},
        {"weights": {"source": {"kind": "checkpoint", "family": "no-such-family"}}},
        {"weights": "not an object", "trace": ["not", "an", "object"], "kept": 3},
    ],
)
def test_anything_else_is_unknown_not_a_crash(manifest: dict[str, object]) -> None:
    assert classify(manifest, "llama").path == route.UNKNOWN


def test_the_parts_of_posencs_trace_record_are_what_it_kept_and_replaced() -> None:
    """posenc's trace record lists its positional parts with a status (TracePart): the census reads them."""
    parts = [
        {"part": "rotary angles", "status": "replaced", "detail": "posenc's precomputed tables"},
        {"part": "stack position tensor", "status": "kept", "detail": "sinusoidal_pos from encoder.embed_positions"},
        {"part": "position embeddings", "status": "absent", "detail": ""},
    ]
    found = classify({"trace": {"model_type": "roformer", "parts": parts}}, "roformer")
    assert found.path == "trace"
    assert found.kept == ("stack position tensor (sinusoidal_pos from encoder.embed_positions)",)
    assert found.replaced == ("rotary angles (posenc's precomputed tables)",)


def _traced(path: str, cls: str = "transformers.models.led.modeling_led.LEDDecoderAttention") -> dict[str, object]:
    return _manifest("trace", "led", trace={"attention": {"path": path, "cls": cls}})


def test_the_module_an_export_is_of_is_its_qualified_name() -> None:
    from posenc.census.route import module_of

    assert module_of(_traced("decoder.layers.0.self_attn")) == (
        "decoder.layers.0.self_attn: transformers.models.led.modeling_led.LEDDecoderAttention"
    )
    tower = _manifest("trace", "t5gemma", trace={"attention": {"path": "layers.0.self_attn", "cls": "A"},
                                                  "tower": {"path": "model.encoder", "cls": "B"}})  # fmt: skip
    assert module_of(tower) == "model.encoder.layers.0.self_attn: A"
    family = _manifest("llama", "llama")
    family["weights"]["source"]["tensors"] = {"model.layers.3.self_attn.q_proj.weight": "a",  # type: ignore[index]
                                              "model.layers.3.self_attn.k_proj.weight": "b"}  # fmt: skip
    assert module_of(family) == "model.layers.3.self_attn"
    assert module_of(_manifest("llama", "llama")) == ""


def test_two_layer_kinds_on_one_module_fail_the_census_row() -> None:
    """Today's main's LED row: its encoder kind captured the decoder's attention (``layers.0.self_attn`` of an
    ``LEDDecoder`` built alone), both kinds passed on one module. Two kinds of a type are two modules of its model:
    one module for both is a capture error, and both kinds fail, naming the other."""
    from posenc.census.report import type_passed
    from posenc.census.route import module_of
    from posenc.census.worker import same_modules

    passed = {"passed": True, "worst_hf": 5.07e-07, "rows": 45, "failed": []}
    wrong = [{"layer": 0, "stack": stack, "attention": True, "path": "trace", "parity": dict(passed),
              "module": module_of(_traced("layers.0.self_attn"))} for stack in ("encoder", "decoder")]  # fmt: skip
    assert type_passed({"status": "ok", "layers": wrong})  # what the census page said
    same_modules(wrong)
    assert not type_passed({"status": "ok", "layers": wrong})
    assert [k["parity"]["passed"] for k in wrong] == [False, False]
    assert "the same module as decoder layer 0 (layers.0.self_attn: " in wrong[0]["parity"]["failed"][0]
    assert "the same module as encoder layer 0" in wrong[1]["parity"]["failed"][0]
    right = [{**kind, "parity": dict(passed), "module": module_of(_traced(f"{kind['stack']}.layers.0.self_attn"))}
             for kind in wrong]  # fmt: skip
    same_modules(right)
    assert type_passed({"status": "ok", "layers": right})
