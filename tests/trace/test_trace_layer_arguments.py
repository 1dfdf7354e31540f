"""Arguments a layer receives from another layer or as a dict: a reused top-k selection of keys
(:data:`posenc.trace.inputs.EVERY_KEY`), and the refusals of what the unit cannot rebuild.

HY-V4's shared DeepSeek-sparse-attention layers (``indexer_types`` 'shared') take ``prev_topk_indices``, the keys the
last full layer's lightning indexer kept: ``topk(min(index_topk, K))`` of its index scores ("DeepSeek-V3.2: Pushing
the Frontier of Open Large Language Models", DeepSeek-AI, 2025, https://arxiv.org/abs/2512.02556). Over at most
``index_topk`` keys that is every key, so the unit passes every key's index and the graph serves positions below
``index_topk``.

References: the checkpoint's own transformers model run on its own (a prompt, then a decode step with its cache,
hooked at the shared layer's attention: the indices it gets there come from layer 0's indexer, in score order), and
``validate --against-hf`` in the slow run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from posenc.checkpoints.samples import NO_SPECIAL_TOKENS, TINY, Sample
from posenc.errors import ExportError
from posenc.trace.build import plan_trace, traced_module
from posenc.trace.capture import capture_layer
from tests.trace.samples import build

_HY = {**TINY, **NO_SPECIAL_TOKENS, "num_hidden_layers": 2, "num_key_value_heads": 4, "head_dim": 8,
       "q_lora_rank": 24, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
       "index_head_dim": 16, "index_n_heads": 2, "index_topk": 64, "indexer_types": ["full", "shared"],
       "mlp_layer_types": ["dense", "dense"], "n_routed_experts": 4, "moe_intermediate_size": 32,
       "num_experts_per_tok": 2, "hc_mult": 2, "vocab_size": 96}  # fmt: skip
SHARED = Sample("hy_v4", "a DSA layer reusing layer 0's top-k", "HYV4Config", "HYV4ForCausalLM", _HY, layer=1)


def _model_steps(folder: Path) -> list[dict[str, torch.Tensor]]:
    """Layer 1's attention in the model's own forward: a 5-token prompt, then one token with the model's cache;
    per call its hidden input, the indices it was handed and its output."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    seen: list[dict[str, torch.Tensor]] = []

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> None:
        seen.append({"hidden": kwargs["hidden_states"], "indices": kwargs["prev_topk_indices"], "out": output[0]})

    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(3))
    cache = transformers.DynamicCache(config=model.config)
    handle = model.model.layers[1].self_attn.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=ids[:, :5], past_key_values=cache, use_cache=True)
            seen[0]["past"] = tuple(t.clone() for t in (cache.layers[1].keys, cache.layers[1].values))
            model(input_ids=ids[:, 5:], past_key_values=cache, use_cache=True)
    finally:
        handle.remove()
    return seen


def test_a_layer_reusing_a_top_k_that_keeps_every_key_matches_the_model(tmp_path: Path) -> None:
    """HY-V4's shared layer 1 is handed layer 0's top-k indices (every key, in score order): the capture records
    them as every key's index, and the unit (posenc's float64 angles, every key's index ``0 .. P + S - 1``) matches
    the model's own forward on a prompt and on a decode step over its cache within 1e-5."""
    folder = build(SHARED, tmp_path)
    captured = capture_layer(folder, 1)
    assert captured.call.keywords["prev_topk_indices"] == "every_key"
    assert captured.cache_kind == "dynamic"  # the shared layer writes no indexer keys of its own
    unit = traced_module(plan_trace(captured), angles="exact", max_positions=64)
    prompt, step = _model_steps(folder)
    assert not torch.equal(prompt["indices"][0, -1].long(), torch.arange(5))  # score order, not the unit's
    with torch.no_grad():
        out = unit(prompt["hidden"], torch.arange(5).unsqueeze(0))[0]
        stepped = unit(step["hidden"], torch.tensor([[5]]), *prompt["past"])[0]
    for got, want in ((out, prompt["out"]), (stepped, step["out"])):
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), float((got - want).abs().max())


def test_a_reused_top_k_that_drops_keys_is_refused_by_name(tmp_path: Path) -> None:
    """With index_topk 4 below the capture's 8 tokens the indices the layer is handed drop keys, which the unit
    cannot rebuild from positions: refused naming the argument and what it is."""
    folder = build(dataclasses_replace(SHARED, "hy_v4-topk4", index_topk=4), tmp_path)
    with pytest.raises(ExportError, match=r"'prev_topk_indices' \(\[1, 8, 4\]\), the keys an earlier layer"):
        capture_layer(folder, 1)


def dataclasses_replace(sample: Sample, name: str, **settings: object) -> Sample:
    """``sample`` under another name with some settings changed."""
    import dataclasses

    return dataclasses.replace(sample.with_settings(**settings), name=name)


@pytest.mark.slow
def test_a_shared_top_k_layer_exports_serving_positions_below_index_topk(tmp_path: Path) -> None:
    """The shared layer's graph serves positions below index_topk (guarded), says why, and matches its own module
    (``validate --against-hf``)."""
    from posenc.export.trace import export_traced
    from posenc.graphs.trace_rewrite import replace_positions
    from posenc.validate.checkpoint import validate_against_checkpoint

    folder = build(SHARED, tmp_path)
    result = export_traced(tmp_path / "shared.onnx", folder, layer=1, rewrite=replace_positions)
    assert result.manifest.max_positions == 64
    assert "past_indexer_key" not in result.manifest.input_names
    parts = {part.part: part for part in result.manifest.trace.parts}
    assert parts["sparse top-k selection"].status == "kept"
    assert "reuses the keys an earlier layer" in parts["sparse top-k selection"].detail
    assert parts["rotary angles"].status == "replaced"
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, report.to_markdown()


@pytest.mark.slow
def test_mistral_large4_nope_layer_with_a_zero_wide_rotated_slice_matches_its_module(tmp_path: Path) -> None:
    """Mistral Large 4's layer 3 (the census's tiny config: no RoPE there, a full indexer, handed layer 2's top-k)
    caches an empty rotated key slice: it exports with ``past_value [B, 1, P, 0]`` and matches its own module."""
    from posenc.census.tiny import save_tiny_model, tiny_config
    from posenc.export.trace import export_traced
    from posenc.graphs.trace_rewrite import replace_positions
    from posenc.validate.checkpoint import validate_against_checkpoint

    folder = tmp_path / "mistral_large4_text"
    save_tiny_model(tiny_config("mistral_large4_text").config, "MistralLarge4TextModel", folder)
    result = export_traced(tmp_path / "l3.onnx", folder, layer=3, rewrite=replace_positions)
    assert result.manifest.input("past_value").shape[3] == 0
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, report.to_markdown()


def test_a_dict_argument_is_refused_naming_its_entries() -> None:
    """An argument the unit cannot rebuild that is a dict (ZAYA's masks per use, DeepSeek-V4's cos/sin per rope
    type) is refused listing what it holds; a second stream of another length than the tokens says what it is."""
    from posenc.trace.arguments import classify

    positions = torch.arange(8).unsqueeze(0)
    masks = {"causal": torch.zeros(1, 1, 8, 8), "conv": None}
    with pytest.raises(ExportError, match=r"'attention_mask' \(dict \{'causal': \[1, 1, 8, 8\], 'conv': None\}\)"):
        classify("attention_mask", masks, positions, None, transformers.Cache, False)
    angles = {"main": (torch.zeros(1, 8, 4), torch.zeros(1, 8, 4))}
    with pytest.raises(ExportError, match=r"\(dict \{'main': tuple of 2\}\)"):
        classify("position_embeddings", angles, positions, None, transformers.Cache, False)
    with pytest.raises(ExportError, match=r"'value_embeds' \(\[1, 7, 32\]\), value embeddings \[B, S, Hkv \* D\]"):
        classify("value_embeds", torch.randn(1, 7, 32), positions, None, transformers.Cache, False)  # not [B, S, W]


REFUSED = {
    ("zaya", "ZayaModel", 0): "the attention reads a convolution or recurrent state from its cache",
    ("deepseek_v4", "DeepseekV4Model", 0): "(DeepseekV4HCACache) holds buffer_kv beside its keys and values",
    ("deepseek_v4", "DeepseekV4Model", 3): "(DeepseekV4CSACache) holds compressed_kv beside its keys and values",
}
"""Census types (their tiny configs) whose dict arguments are rebuilt, refused with the state their cache holds
(ZAYA's convolution of q and k over earlier tokens, DeepSeek-V4's compressed windows)."""


@pytest.mark.slow
@pytest.mark.parametrize("case", list(REFUSED), ids=lambda case: f"{case[0]}-{case[2]}")
def test_census_types_are_refused_saying_what_the_argument_is(case: tuple[str, str, int], tmp_path: Path) -> None:
    from posenc.census.tiny import save_tiny_model, tiny_config

    name, model_class, layer = case
    folder = tmp_path / name
    save_tiny_model(tiny_config(name).config, model_class, folder)
    with pytest.raises(ExportError) as caught:
        capture_layer(folder, layer)
    assert REFUSED[case] in str(caught.value)


def test_value_embeddings_are_a_second_input_that_matches_the_model(tmp_path: Path) -> None:
    """NeoMME's layer 5 adds value embeddings (a table read by the token ids) to its values: the unit takes them as
    the graph input ``value_embeds [B, S, 32]`` after the others, and on what the model hands the layer in its own
    forward it matches the model's output within 1e-5 (posenc's float64 angles); other value embeddings move it."""
    from posenc.census.tiny import save_tiny_model, tiny_config

    folder = tmp_path / "neomme"
    save_tiny_model(tiny_config("neomme").config, "NeoMMEModel", folder)
    captured = capture_layer(folder, 5)
    assert captured.call.keywords["value_embeds"] == "stream"
    unit = traced_module(plan_trace(captured), angles="exact")
    assert unit.stream_keys == ["value_embeds"]
    model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    seen: dict[str, torch.Tensor] = {}

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> None:
        seen.update(hidden=kwargs.get("hidden_states", args[0] if args else None), out=output[0])
        seen["value_embeds"] = kwargs["value_embeds"]

    handle = model.layers[5].self_attn.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=torch.randint(0, 96, (1, 7), generator=torch.Generator().manual_seed(2)))
    finally:
        handle.remove()
    positions = torch.arange(7).unsqueeze(0)
    with torch.no_grad():
        got = unit(seen["hidden"], positions, seen["value_embeds"])[0]
        other = unit(seen["hidden"], positions, torch.zeros_like(seen["value_embeds"]))[0]
    assert torch.allclose(got, seen["out"], atol=1e-5, rtol=1e-5), float((got - seen["out"]).abs().max())
    assert not torch.allclose(other, seen["out"], atol=1e-3)


def test_a_dict_argument_is_rebuilt_from_the_entries_the_attention_reads() -> None:
    """A dict argument (ZAYA's ``attention_mask`` ``{'causal': mask, 'conv': None}``) is recorded by the entries the
    attention reads (:class:`posenc.trace.calls.ReadDict`), each classified like an argument; the unit hands the
    attention a dict of those entries rebuilt (the mask from positions) and drops the others. An entry of a kind it
    cannot rebuild is refused naming the entry."""
    from posenc.trace.calls import Call, ReadDict, _recipe
    from posenc.trace.module import TracedAttention
    from posenc.trace.record import MaskRecipe

    positions = torch.arange(8).unsqueeze(0)
    mask = torch.zeros(1, 1, 8, 8).masked_fill(
        torch.ones(8, 8, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min
    )
    masks = ReadDict({"causal": mask, "conv": None, "unused": torch.randn(1, 8)})
    masks.get("causal"), masks.get("conv")
    hidden = torch.randn(1, 8, 16)
    call = Call((), {"hidden_states": hidden, "attention_mask": masks})
    recipe, rotary = _recipe(call, positions, {}, transformers.Cache, "hidden_states", ["hidden_states"])
    assert recipe.keywords["attention_mask"] == "entries"
    assert rotary is None
    assert recipe.constants["attention_mask"] == {"causal": ["mask", None], "conv": ["constant", None]}

    class Reads(torch.nn.Module):
        def forward(self, hidden_states: torch.Tensor, attention_mask: dict) -> tuple[torch.Tensor]:
            self.seen = attention_mask
            return (hidden_states,)

    attention = Reads()
    unit = TracedAttention(attention, None, 0, recipe, None, MaskRecipe("additive", causal=True), cacheless=True)
    unit(hidden, positions)
    assert set(attention.seen) == {"causal", "conv"}
    assert attention.seen["conv"] is None
    assert torch.equal(attention.seen["causal"], mask)
    odd = ReadDict({"scale": torch.randn(1, 8, 3)})
    odd.get("scale")
    with pytest.raises(ExportError, match=r"attention_mask\['scale'\]"):
        _recipe(Call((), {"hidden_states": hidden, "attention_mask": odd}), positions, {}, transformers.Cache,
                "hidden_states", ["hidden_states"])  # fmt: skip


@pytest.mark.slow
def test_value_embeddings_export_as_a_graph_input_and_match_the_module(tmp_path: Path) -> None:
    """NeoMME's layer 5 exports with ``value_embeds [batch, seq, 32]`` as a graph input after the others, and
    ``validate --against-hf`` (the transformers module fed the same value embeddings) passes."""
    from posenc.census.tiny import save_tiny_model, tiny_config
    from posenc.export.trace import export_traced
    from posenc.graphs.trace_rewrite import replace_positions
    from posenc.validate.checkpoint import validate_against_checkpoint

    folder = tmp_path / "neomme"
    save_tiny_model(tiny_config("neomme").config, "NeoMMEModel", folder)
    result = export_traced(tmp_path / "l5.onnx", folder, layer=5, rewrite=replace_positions)
    assert result.manifest.input_names[-1] == "value_embeds"
    assert tuple(result.manifest.input("value_embeds").shape) == ("batch", "seq", 32)
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, report.to_markdown()
