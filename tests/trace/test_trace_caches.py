"""Traced layers whose KV cache holds keys and values of different widths (:mod:`posenc.trace.caches`).

Multi-head latent attention (DeepSeek-AI, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts
Language Model", 2024, https://arxiv.org/abs/2405.04434) as transformers 5.23 runs it caches the compressed latent
``[B, 1, P, kv_lora_rank]`` and the rotated shared key slice ``[B, 1, P, qk_rope_head_dim]``; MiMo-V2-Flash caches
values narrower than its keys (``v_head_dim``). DeepSeek sparse attention's cache also holds its indexer's keys:
refused.

References: the checkpoint's own transformers model run on its own (a prompt, then a decode step with its
``DynamicCache``, hooked at the layer's attention), and ``validate --against-hf`` (the checkpoint's attention module,
float32 and float64 angles) for every sample in the slow run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from posenc.checkpoints.samples import NO_SPECIAL_TOKENS, TINY, Sample
from posenc.errors import ConfigError, ExportError
from posenc.export.trace import export_traced
from posenc.graphs.trace_rewrite import replace_positions
from posenc.trace.build import plan_trace, traced_module
from posenc.trace.capture import capture_layer
from posenc.validate.checkpoint import validate_against_checkpoint
from tests.trace.samples import build

_MLA = {**TINY, **NO_SPECIAL_TOKENS, "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "head_dim": 8}  # fmt: skip
_MOE = {"n_routed_experts": 4, "moe_intermediate_size": 32, "num_experts_per_tok": 2}
_MIMO = {**TINY, **NO_SPECIAL_TOKENS, "num_hidden_layers": 2, "head_dim": 32, "v_head_dim": 16, "sliding_window": 8,
         "layer_types": ["full_attention", "sliding_attention"], "mlp_layer_types": ["dense", "dense"],
         **_MOE}  # fmt: skip

CACHES: dict[str, Sample] = {
    s.name: s
    for s in (
        Sample("minicpm3", "MLA: latent and rotated key slice", "MiniCPM3Config", "MiniCPM3ForCausalLM",
               {**_MLA, "num_hidden_layers": 1}),
        Sample("glm4_moe_lite", "MLA, no head_dim in the config", "Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM",
               {**{k: v for k, v in _MLA.items() if k != "head_dim"}, **_MOE, "num_hidden_layers": 1}),
        Sample("youtu", "MLA", "YoutuConfig", "YoutuForCausalLM", {**_MLA, "num_hidden_layers": 1}),
        Sample("axk1", "MLA, MoE", "AXK1Config", "AXK1ForCausalLM", {**_MLA, **_MOE, "num_hidden_layers": 1}),
        Sample("mimo_v2_flash", "values narrower than keys", "MiMoV2FlashConfig", "MiMoV2FlashForCausalLM", _MIMO),
        Sample("mimo_v2_flash-sliding", "values narrower than keys, sliding window, partial 0.334",
               "MiMoV2FlashConfig", "MiMoV2FlashForCausalLM", _MIMO, layer=1),
    )
}  # fmt: skip
"""Model types whose cache's values differ from its keys in width."""

ZAYA = Sample("zaya", "convolution and recurrent states in the cache", "ZayaConfig", "ZayaForCausalLM",
              {**TINY, **NO_SPECIAL_TOKENS, "num_hidden_layers": 1, "head_dim": 16, "num_experts": 4,
               "num_experts_per_tok": 1, "moe_intermediate_size": 64, "router_hidden_size": 64, "cca_time0": 2,
               "cca_time1": 3, "max_position_embeddings": 2048})  # fmt: skip
"""ZAYA's compressed convolutional attention: q and k from a causal convolution over earlier tokens (its state
``[B, C, 3]`` in the cache), half of each value head from the previous token (a recurrent state ``[B, W]``)."""

INKLING = Sample("inkling_text", "a sliding window over a hybrid cache, short convolutions of keys and values",
                 "InklingTextConfig", "InklingForCausalLM",
                 {**TINY, **NO_SPECIAL_TOKENS, "num_hidden_layers": 1, "head_dim": 16, "swa_head_dim": 16,
                  "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2, "d_rel": 16, "n_routed_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 64, "sliding_window_size": 8,
                  "layer_types": ["hybrid_sliding"], "mlp_layer_types": ["dense"],
                  "max_position_embeddings": 2048})  # fmt: skip
"""Inkling's sliding hybrid layer: relative logits, short convolutions of keys and values (their states in the cache
beside the layer's own convolutions')."""

RSWA = Sample("unlimited_ocr_text", "reference sliding window: the prompt's keys kept apart", "UnlimitedOcrTextConfig",
              "UnlimitedOcrTextModel", {**TINY, **NO_SPECIAL_TOKENS, "num_hidden_layers": 1, "head_dim": 16,
                                         "num_key_value_heads": 4, "sliding_window": 8, "mlp_layer_types": ["dense"],
                                         "max_position_embeddings": 2048})  # fmt: skip
"""Unlimited-OCR's text model: its cache layer keeps the prompt's keys apart from a window of 8 over decoded ones."""

DSA = Sample("deepseek_v32", "DeepSeek sparse attention (indexer keys in the cache)", "DeepseekV32Config",
             "DeepseekV32ForCausalLM", {**_MLA, "num_hidden_layers": 1, "index_head_dim": 16, "index_n_heads": 4,
                                        "index_topk": 3, "first_k_dense_replace": 1})  # fmt: skip

RUNTIME: dict[str, Sample] = {
    s.name: s
    for s in (
        Sample("codegen", "a sinusoid table read by position inside the attention", "CodeGenConfig",
               "CodeGenForCausalLM", {"n_embd": 64, "n_head": 4, "n_layer": 1, "rotary_dim": 8, "n_positions": 2048,
                                      "vocab_size": 96, **NO_SPECIAL_TOKENS}),
        Sample("ctrl", "v, k, q all the hidden states; sinusoid positions before layer 0", "CTRLConfig",
               "CTRLLMHeadModel", {"n_embd": 64, "n_head": 4, "n_layer": 1, "dff": 64, "n_positions": 256,
                                   "vocab_size": 96}),
    )
}  # fmt: skip
"""Types whose traced export failed at run time: CodeGen's probe read its table past its rows (the rewrite now probes
within the model's context), CTRL's self-check fed the probe to one of its three hidden-state arguments."""


def _decode_step(folder: Path) -> dict[str, Any]:
    """Layer 0's attention in the model's own forward: a 5-token prompt, then one token with the model's cache:
    the step's hidden input and output, and the cache's keys and values before and after the step."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    attention = model.model.layers[0].self_attn
    seen: dict[str, Any] = {}

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> None:
        seen["hidden"], seen["out"] = kwargs["hidden_states"], output[0]

    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(3))
    cache = transformers.DynamicCache(config=model.config)
    names = ("keys", "values", "indexer_keys") if hasattr(cache.layers[0], "indexer_keys") else ("keys", "values")
    with torch.no_grad():
        model(input_ids=ids[:, :5], past_key_values=cache, use_cache=True)
        seen["past"] = tuple(getattr(cache.layers[0], name).clone() for name in names)
        handle = attention.register_forward_hook(hook, with_kwargs=True)
        try:
            model(input_ids=ids[:, 5:], past_key_values=cache, use_cache=True)
        finally:
            handle.remove()
    seen["present"] = tuple(getattr(cache.layers[0], name) for name in names)
    return seen


def test_a_latent_cache_of_two_widths_is_carried_and_a_decode_step_matches_the_model(tmp_path: Path) -> None:
    """MiniCPM3 caches the latent (32 wide) and the rotated key slice (8 wide): the unit takes and returns both as they
    are, its angles are posenc's RoPE over the 8-wide slice (matched on probe positions), and a decode step with the
    model's own cache matches the model's own forward within 1e-5 (posenc's float64 angles)."""
    folder = build(CACHES["minicpm3"], tmp_path)
    captured = capture_layer(folder)
    assert (captured.kv_heads, captured.head_dim, captured.value_dim) == (1, 32, 8)
    plan = plan_trace(captured)
    assert plan.angles is not None, plan.note
    assert plan.params["partial_rotary_factor"] == 8 / 32  # the rotary width as a share of the cache's key width
    unit = traced_module(plan, angles="exact", max_positions=64)
    seen = _decode_step(folder)
    with torch.no_grad():
        out, key, value = unit(seen["hidden"], torch.tensor([[5]]), *seen["past"])
    assert key.shape == (1, 1, 6, 32)
    assert value.shape == (1, 1, 6, 8)
    for got, want in ((out, seen["out"]), (key, seen["present"][0]), (value, seen["present"][1])):
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), float((got - want).abs().max())


def test_a_dsa_layer_carries_its_indexer_keys_as_a_third_cache(tmp_path: Path) -> None:
    """DeepSeek-V3.2's cache layer also holds its lightning indexer's keys ``[B, P, 16]``: the unit takes and returns
    them beside the latent and the rotated key slice, and a decode step over 6 keys with index_topk 3 (the sparse
    selection at work) matches the model's own forward."""
    folder = build(DSA, tmp_path)
    captured = capture_layer(folder)
    assert (captured.head_dim, captured.value_dim, captured.indexer_dim, captured.cache_kind) == (32, 8, 16, "indexed")
    unit = traced_module(plan_trace(captured), angles="exact", max_positions=64)
    seen = _decode_step(folder)
    with torch.no_grad():
        got = unit(seen["hidden"], torch.tensor([[5]]), *seen["past"])
    assert len(got) == 4
    assert got[3].shape == (1, 6, 16)
    for value, want in zip(got, (seen["out"], *seen["present"]), strict=True):
        assert torch.allclose(value, want, atol=1e-5, rtol=1e-5), float((value - want).abs().max())


def _hybrid_steps(folder: Path, layer: int, prompt: int, step: int, states: int) -> dict[str, Any]:
    """A hybrid model's layer ``layer`` in the model's own forward: a ``prompt``-token call, then ``step`` tokens with
    the model's cache; the step's hidden input and output, and the layer's cache (keys, values, the convolution
    states ``0 .. states - 1`` and, where filled, recurrent state 0) before and after it."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    seen: dict[str, Any] = {}

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> None:
        seen["hidden"], seen["out"] = kwargs["hidden_states"], output[0]

    def state(entry: Any) -> tuple[torch.Tensor, ...]:
        recurrent = [entry.recurrent_states[0]] if entry.recurrent_states[0] is not None else []
        held = (entry.keys, entry.values, *(entry.conv_states[i] for i in range(states)), *recurrent)
        return tuple(t.clone() for t in held)

    ids = torch.randint(0, 96, (2, prompt + step), generator=torch.Generator().manual_seed(3))
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, :prompt], past_key_values=cache, use_cache=True)
        seen["past"] = state(cache.layers[layer])
        handle = model.model.layers[layer].self_attn.register_forward_hook(hook, with_kwargs=True)
        try:
            model(input_ids=ids[:, prompt:], past_key_values=cache, use_cache=True)
        finally:
            handle.remove()
    seen["present"] = state(cache.layers[layer])
    return seen


def test_convolution_and_recurrent_states_are_cache_inputs_and_a_decode_step_matches_the_model(
    tmp_path: Path,
) -> None:
    """ZAYA's cache layer holds, beside keys and values, the convolution state its q and k are computed over and the
    previous token's delayed values: the capture reads them as the states ``conv_state_0 [C, 3]`` and
    ``recurrent_state_0 [W]``; the unit takes them after past_key / past_value and returns them updated, and steps of
    one and of three tokens after a 5-token prompt, fed the model's own cache, match the model's own forward (its
    output and every cache tensor); the same unit rebuilt from its manifest record does too. Fed no cache, the unit is
    the model's first call (the capture's self-check)."""
    from tests.trace.samples import unit_and_rebuilt

    folder = build(ZAYA, tmp_path)
    captured = capture_layer(folder)
    conv = (4 + 2) * 16  # q and k channels (4 query heads, 2 key heads)
    assert (captured.cache_kind, captured.cache_layer) == ("linear", "LinearAttentionAndFullAttentionLayer")
    assert [(s.name, s.shape) for s in captured.states] == [("conv_state_0", (conv, 3)), ("recurrent_state_0", (16,))]
    plan = plan_trace(captured)
    assert plan.angles is not None, plan.note
    steps = {step: _hybrid_steps(folder, 0, 5, step, states=1) for step in (1, 3)}
    for unit in (*unit_and_rebuilt(plan), traced_module(plan, angles="exact", max_positions=64)):
        assert unit.cache_inputs == ["past_key", "past_value", "past_conv_state_0", "past_recurrent_state_0"]
        for step, seen in steps.items():
            with torch.no_grad():
                got = unit(seen["hidden"], torch.arange(5, 5 + step).expand(2, step), *seen["past"])
            assert [tuple(t.shape) for t in got[1:]] == [(2, 2, 5 + step, 16)] * 2 + [(2, conv, 3), (2, 16)]
            for value, want in zip(got, (seen["out"], *seen["present"]), strict=True):
                assert torch.allclose(value, want, atol=1e-5, rtol=1e-5), float((value - want).abs().max())
    with pytest.raises(ConfigError, match=r"also holds past_conv_state_0, past_recurrent_state_0"):
        traced_module(plan)(seen["hidden"], None, *seen["past"][:2])


def test_a_sliding_hybrid_layer_carries_the_states_its_attention_reads_and_steps_past_its_window(
    tmp_path: Path,
) -> None:
    """Inkling's sliding layer caches (LinearAttentionAndSlidingWindowAttentionLayer) the last ``window - 1`` keys and
    four convolution states, two of them its attention's (keys' and values' short convolutions) and two its layer's:
    the unit carries those two (read from what the attention alone fills), rebuilt in the full layer with the
    concatenated cache; after a 10-token prompt past the window of 8, steps of one and three tokens, fed the model's
    stored keys at positions 3 .. 9 (earlier slots zero: the window hides them), match the model's own forward."""
    folder = build(INKLING, tmp_path)
    captured = capture_layer(folder, layer=0)
    assert (captured.cache_kind, captured.cache_layer) == ("linear", "LinearAttentionAndFullAttentionLayer")
    assert [(s.name, s.shape) for s in captured.states] == [("conv_state_0", (32, 4)), ("conv_state_1", (32, 4))]
    unit = traced_module(plan_trace(captured))
    for step in (1, 3):
        seen = _hybrid_steps(folder, 0, 10, step, states=2)
        keys, values, *states = seen["past"]
        hidden = torch.zeros(2, 2, 3, 16)  # positions 0 .. 2, outside the window of every query
        with torch.no_grad():
            got = unit(seen["hidden"], torch.arange(10, 10 + step).expand(2, step),
                       torch.cat([hidden, keys], 2), torch.cat([hidden, values], 2), *states)  # fmt: skip
        got = (got[0], got[1][:, :, -7:], got[2][:, :, -7:], *got[3:])  # the model keeps the last window - 1 keys
        for value, want in zip(got, (seen["out"], *seen["present"]), strict=True):
            assert torch.allclose(value, want, atol=1e-5, rtol=1e-5), float((value - want).abs().max())


def test_a_reference_sliding_window_is_a_plain_cache_below_its_window(tmp_path: Path) -> None:
    """Unlimited-OCR's cache layer keeps the prompt's keys (``prefill_keys``) apart from a window of 8 over the decoded
    ones: the capture reads the layer's widths from the prompt's keys and its window's config field; below 8 positions
    the unit, fed the prompt's and the decoded keys as one cache, matches the model's own forward (a 4-token prompt,
    then a step of one or of three tokens: positions up to 7); the export serves positions below 8 (test below)."""
    folder = build(RSWA, tmp_path)
    captured = capture_layer(folder)
    assert (captured.window_field, captured.cache_kind, captured.kv_heads, captured.head_dim) == (
        "sliding_window", "dynamic", 4, 16)  # fmt: skip
    unit = traced_module(plan_trace(captured), angles="exact", max_positions=8)
    model = transformers.UnlimitedOcrTextModel.from_pretrained(folder, attn_implementation="eager").eval()
    seen: dict[str, Any] = {}

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> None:
        seen["hidden"], seen["out"] = kwargs["hidden_states"], output[0]

    def held(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:  # the prompt's keys, then the decoded ones
        keys = [layer.prefill_keys, *([layer.keys] if layer.keys.numel() else [])]
        values = [layer.prefill_values, *([layer.values] if layer.values.numel() else [])]
        return torch.cat(keys, 2).clone(), torch.cat(values, 2).clone()

    for step in (1, 3):
        ids = torch.randint(0, 96, (2, 4 + step), generator=torch.Generator().manual_seed(3))
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids[:, :4], past_key_values=cache, use_cache=True)
            past = held(cache.layers[0])
            handle = model.layers[0].self_attn.register_forward_hook(hook, with_kwargs=True)
            try:
                model(input_ids=ids[:, 4:], past_key_values=cache, use_cache=True)
            finally:
                handle.remove()
            got = unit(seen["hidden"], torch.arange(4, 4 + step).expand(2, step), *past)
        assert type(cache.layers[0]).__name__ == "UnlimitedOcrDynamicReferenceSlidingWindowLayer"
        for value, want in zip(got, (seen["out"], *held(cache.layers[0])), strict=True):
            assert torch.allclose(value, want, atol=1e-5, rtol=1e-5), float((value - want).abs().max())


def test_an_attention_called_with_the_hidden_states_several_times_is_probed_with_each(tmp_path: Path) -> None:
    """CTRL calls its attention ``(v, k, q)`` with the layer's normed states three times: the wrapper's self-check
    feeds the probe's states to every one of them (it differed from the model's call by 6e-2 when only the first
    was), and the wrapper matches the module called with one state for all three."""
    captured = capture_layer(build(RUNTIME["ctrl"], tmp_path))
    assert captured.call.positional == ("hidden", "hidden", "hidden")
    plan = plan_trace(captured)  # raises where the wrapper and the model's own call differ
    hidden = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = traced_module(plan)(hidden, torch.arange(4)[None])[0]
        causal = torch.full((4, 4), torch.finfo(torch.float32).min).triu(1)[None, None]  # the model's additive mask
        want = captured.attention(hidden, hidden, hidden, layer_past=None, attention_mask=causal)[0]
    assert torch.allclose(got, want, atol=1e-6)
    assert captured.outside == "pos_encoding"  # its sinusoid positions enter before layer 0, outside the unit


def test_a_linear_attention_layer_is_refused_as_not_softmax_attention(tmp_path: Path) -> None:
    """MiniMax's ``linear_attention`` layers hold MiniMaxLightningAttention (linear attention, no softmax): refused
    by name, pointing at the layers with softmax attention."""
    sample = Sample("minimax", "lightning attention layers", "MiniMaxConfig", "MiniMaxForCausalLM",
                    {**TINY, **NO_SPECIAL_TOKENS, "num_hidden_layers": 2, "head_dim": 16, "num_local_experts": 4,
                     "num_experts_per_tok": 2, "layer_types": ["full_attention", "linear_attention"]})  # fmt: skip
    with pytest.raises(ConfigError, match=r"layer 1 .* no softmax attention .*MiniMaxLightningAttention.*: \[0\]"):
        capture_layer(build(sample, tmp_path), layer=1)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNTIME))
def test_runtime_failures_export_and_match_their_own_module(name: str, tmp_path: Path) -> None:
    """Exported with posenc's rewrite and held to its own module by validate --against-hf; what stays as traced is
    said so (CodeGen's angles from its table: kept; CTRL's positions before layer 0: absent from the unit)."""
    sample = RUNTIME[name]
    folder = build(sample, tmp_path)
    result = export_traced(tmp_path / f"{name}.onnx", folder, rewrite=replace_positions)
    parts = {part.part: part.status for part in result.manifest.trace.parts}
    assert parts["rotary angles"] == ("kept" if name == "codegen" else "absent")
    if name == "ctrl":
        assert parts["stack embeddings"] == "absent"
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, report.to_markdown()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sample", "states"),
    [(ZAYA, ["conv_state_0", "recurrent_state_0"]), (INKLING, ["conv_state_0", "conv_state_1"])],
    ids=["zaya", "inkling"],
)
def test_a_layer_with_cache_states_exports_and_matches_its_module(
    sample: Sample, states: list[str], tmp_path: Path
) -> None:
    """ZAYA's and Inkling's traced graphs take their states after past_key / past_value and return them updated;
    validated against the checkpoint's module fed the same cache (prompts and decode steps of 1 and more tokens:
    their length guards are deferred), after the positional rewrite; ZAYA's also over a decode sequence, where every
    cache (its states too) is carried from step to step by the graph and by the module alike."""
    folder = build(sample, tmp_path)
    result = export_traced(tmp_path / f"{sample.name}.onnx", folder, rewrite=replace_positions)
    manifest = result.manifest
    assert [spec.name for spec in manifest.inputs][2:] == ["past_key", "past_value", *(f"past_{s}" for s in states)]
    assert manifest.output_names[3:] == [f"present_{s}" for s in states]
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, report.to_markdown()
    if sample is ZAYA:
        from posenc.export.shapes import Shape
        from posenc.validate.checkpoint import decode_against_checkpoint

        schedule = [Shape(2, 5, 0), *(Shape(2, 1, 5 + i) for i in range(4)), Shape(2, 3, 9)]
        decoded = decode_against_checkpoint(result.path, folder, schedule=schedule)
        assert decoded.passed, decoded.to_markdown()
        assert {row.output for row in decoded.rows} >= {f"present_{s}" for s in states}


@pytest.mark.slow
def test_a_reference_sliding_window_exports_serving_positions_below_its_window(tmp_path: Path) -> None:
    """Unlimited-OCR's graph serves positions below its window of 8 (guarded), says so, and matches its own module
    there; a --max-positions beyond the window is refused."""
    folder = build(RSWA, tmp_path)
    result = export_traced(tmp_path / "rswa.onnx", folder, rewrite=replace_positions)
    assert result.manifest.max_positions == 8
    parts = {part.part: part.status for part in result.manifest.trace.parts}
    assert parts["reference sliding window"] == "kept"
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, report.to_markdown()
    with pytest.raises(ConfigError, match=r"beyond this layer's cache bound 8: .*keys leave the cache beyond"):
        export_traced(tmp_path / "far.onnx", folder, max_positions=64)


@pytest.mark.slow
def test_a_dsa_layer_exports_serving_positions_below_its_index_topk(tmp_path: Path) -> None:
    """DeepSeek-V3.2 with index_topk 3: the graph carries the indexer keys, serves positions below 3 (guarded: there
    the selection keeps every key, whatever the order of ties), says so, and matches its own module there."""
    folder = build(DSA, tmp_path)
    result = export_traced(tmp_path / "dsa.onnx", folder, rewrite=replace_positions)
    assert result.manifest.max_positions == 3
    assert result.manifest.input("past_indexer_key").shape[2] == 16
    parts = {part.part: part.status for part in result.manifest.trace.parts}
    assert parts["sparse top-k selection"] == "kept"
    assert parts["rotary angles"] == "replaced"
    report = validate_against_checkpoint(result.path, folder)
    assert report.passed, report.to_markdown()


def test_a_cache_layer_holding_other_state_is_refused_by_name() -> None:
    """DeepSeek-V4's compressor caches fold a window of tokens into one entry when it fills (``compressed_kv``, a dict
    per compressor): an update one graph of dynamic lengths cannot hold, refused naming it. Keys and values of other
    batch or length are refused too; a reference sliding window's prompt keys are read as the cache."""
    from types import SimpleNamespace

    from posenc.trace.caches import cache_widths

    keys, values = torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 4)
    assert cache_widths(SimpleNamespace(keys=keys, values=values), 0, "m").value_dim == 4
    with pytest.raises(ExportError, match=r"holds compressed_kv beside its keys and values .*compress_rate"):
        cache_widths(SimpleNamespace(keys=keys, values=values, compressed_kv={"compressor": keys}), 0, "m")
    empty = torch.zeros(1, 2, 0, 8)
    prompt = cache_widths(SimpleNamespace(keys=empty, values=empty, prefill_keys=keys, prefill_values=values), 0, "m")
    assert (prompt.key_dim, prompt.value_dim, prompt.window_field) == (8, 4, "sliding_window")
    with pytest.raises(ExportError, match=r"does not hold keys \[B, Hkv, P, Dk\]"):
        cache_widths(SimpleNamespace(keys=keys, values=torch.zeros(1, 2, 4, 8)), 0, "m")


def test_values_of_zero_width_are_a_cache_layout() -> None:
    """An MLA layer without RoPE (Mistral Large 4's NoPE layers, ``qk_rope_head_dim`` 0 there) caches its rotated
    key slice zero wide as values ``[B, 1, P, 0]``: carried as such (``value_dim`` 0), not refused as empty."""
    from types import SimpleNamespace

    from posenc.trace.caches import cache_widths

    widths = cache_widths(SimpleNamespace(keys=torch.zeros(1, 1, 5, 32), values=torch.zeros(1, 1, 5, 0)), 3, "m")
    assert (widths.key_dim, widths.value_dim) == (32, 0)
    with pytest.raises(ExportError, match=r"does not hold keys"):
        cache_widths(SimpleNamespace(keys=torch.zeros(1, 1, 0, 32), values=torch.zeros(1, 1, 0, 0)), 3, "m")
