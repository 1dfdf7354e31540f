"""A tiny config of any transformers model type, shrunk generically from the type's own default config.

:func:`tiny_config` starts from ``CONFIG_MAPPING[model_type]()`` (transformers' defaults: the released model's
geometry, usually), turns it into a dict, shrinks every integer field whose name says it is a size, and builds the
config class again from the dict, so the config's own validation judges the result (the rules:
:mod:`posenc.census.shrink`).

L is the smallest layer count from 2 up to ``max_layers`` at which the tiny text config has every *layer kind*
the default has (a kind: the tuple of a layer's entries in the per-layer lists and index lists), so Gemma 3's
five sliding layers and one full layer shrink to six layers, not two sliding ones. Where a config's validation ties
sizes together, the next of :data:`VARIANTS` is tried (e.g. 8 heads: Mamba's heads x head width = 2 x hidden).

The tiny model is ``save_pretrained`` of the randomly initialised (seeded, perturbed) model: never downloaded.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import inspect
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from posenc.census.shrink import (
    NOT_A_KIND,
    PER_LAYER_KEY,
    SKIP_DICTS,
    VARIANTS,
    VOCAB,
    Shrink,
    Targets,
    flat_items,
    int_value,
    is_index_dict,
    is_index_list,
    is_per_layer,
    layer_count,
    remap_ids,
    text_path,
)
from posenc.checkpoints.reference import import_transformers

MODES: dict[str, dict[str, Any]] = {
    # BigBird's block-sparse attention needs sequences of at least (5 + 2 * num_random_blocks) blocks and turns to
    # full attention (with a warning, changing the module's setting) on anything shorter; 'original_full' is the
    # model's full-attention mode, chosen in config.json, whose module the capture can then call as the model does.
    "big_bird": {"attention_type": "original_full"},
    "bigbird_pegasus": {"attention_type": "original_full"},
    # ESM's default is ESM-1b's learned absolute positions; the ESM-2 checkpoints users ship (facebook/esm2_*) set
    # rotary positions and token dropout (ESM-2: "Evolutionary-scale prediction of atomic-level protein structure
    # with a language model", Lin et al., 2023, https://doi.org/10.1126/science.ade2574).
    "esm": {"position_embedding_type": "rotary", "token_dropout": True},
    # Reformer's causal LM head (the released google/reformer-crime-and-punishment) needs ``is_decoder``; the
    # default config is an encoder's.
    "reformer": {"is_decoder": True},
}
"""Per-type settings a tiny config takes (each a real mode of the model, set in its config.json), where the default
mode cannot be captured on a short forward or is not the one the released checkpoints use; the census's notes name
them."""


FIELDS: dict[str, dict[str, Any]] = {
    # HRM's config keeps num_layers_per_stack once set and derives num_hidden_layers (its cache slots) from it;
    # unset, it takes the shrunk num_hidden_layers as the per-stack count and derives the slots from that.
    "hrm_text": {"num_layers_per_stack": None},
}
"""Per-type config fields a tiny config sets so that the shrunk sizes stay consistent (fields the rules do not
shrink, derived by the config class)."""

MIN_LAYERS: dict[str, int] = {
    # Zamba's model ties every hybrid layer's shared transformer to the first one's, and its tie check fails where
    # the model has a single hybrid layer (the released Zamba-7B has 13 of 76); its first 8 layers hold two (2, 7).
    "zamba": 8,
}
"""Per-type smallest layer count of a tiny config, where the model needs more layers than its layer kinds do."""


@dataclasses.dataclass
class TinyConfig:
    """A tiny config and how it was made.

    Attributes:
        config: the transformers config object.
        layers: the text config's layer count L.
        kinds: the distinct layer kinds of the default config (see the module docstring).
        kinds_kept: whether L keeps all of them (False: ``max_layers`` was too few).
        targets: the sizes used.
        rejected: ``"L=..: error"`` of the attempts the config class refused before this one.
    """

    config: Any
    layers: int
    kinds: list[tuple[Any, ...]]
    kinds_kept: bool
    targets: Targets
    rejected: list[str] = dataclasses.field(default_factory=list)
    mode: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The :data:`MODES` settings it took."""


TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    # Step 3.5's model builds a sliding-window mask for every forward, but its default config (all layers full
    # attention) sets no window: the released checkpoints do (512); shrunk to the tiny window like any window.
    "step3p5": {"sliding_window": 512},
    # HunYuan-VL's rotary module splits the head into XD-RoPE sections (its config's ``xdrope_section``, renamed
    # ``mrope_section``), which the default config leaves unset; the released checkpoints' four equal sections,
    # rescaled to the tiny head like any ``mrope_section``.
    "hunyuan_vl_text": {"rope_parameters": {"mrope_section": [16, 16, 16, 16]}},
    # DBRX's attention reads ``attn_config.rope_theta``, which DbrxAttentionConfig does not declare, and clamps its
    # projections to ``clip_qkv`` (None by default, which torch.clamp refuses): the released checkpoints
    # (dbrx-base, dbrx-instruct) set both in their attn_config (500000, 8).
    "dbrx": {"attn_config": {"rope_theta": 500000, "clip_qkv": 8}},
    # dots.llm1's MoE layers size their experts by these counts, None in the default config: the released
    # checkpoints (dots.llm1.base, dots.llm1.inst) route 6 of 128 experts plus 2 shared ones.
    "dots1": {"n_routed_experts": 128, "n_shared_experts": 2, "num_experts_per_tok": 6},
    # LFM2-MoE's model indexes ``layer_types``, None in the default config (its config derives no default): the
    # released LFM2-8B-A1B sets it, 6 grouped-query attention layers among 24 layers of short convolutions. Here
    # as long as the default's 32 layers, with both kinds (the tiny config's layer count keeps every kind).
    "lfm2_moe": {"layer_types": ["conv", "conv", "full_attention", "conv"] * 8},
    # ESM's default leaves the vocabulary and its mask and padding ids unset; the released checkpoints
    # (facebook/esm2_*, esm1b) set a 33-token vocabulary (padding 1, mask 32) and no embedding LayerNorm.
    "esm": {"vocab_size": 33, "pad_token_id": 1, "mask_token_id": 32, "emb_layer_norm_before": False},
    # Moonshine Streaming's decoder attention reads ``num_key_value_heads``, which its config class does not declare
    # (its encoder config does: 8, as many as its heads); checkpoints set it in config.json (multi-head attention).
    "moonshine_streaming": {"num_key_value_heads": 8},
    # Cohere Compass's rotary module reads ``rope_parameters`` per layer type (NoPE where an entry is None), which
    # the default leaves empty: a checkpoint's config.json carries an entry per layer type. Here transformers'
    # default RoPE for the default's one layer type, with the module's default M-RoPE sections (rescaled).
    "cohere_compass_text": {
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [24, 20, 20]}
        }
    },
    # DeepSeek-OCR 2's decoder picks each layer's MLP by ``mlp_layer_types`` and routes ``num_experts_per_tok``
    # experts per group, all None in the default: its released checkpoint (a DeepSeek-V2-style MoE) has a dense
    # first layer and sparse ones after, 6 experts per token in one group (the counts shrink to the census's).
    "deepseek_ocr2_text": {
        "mlp_layer_types": ["dense"] + ["sparse"] * 31,
        "num_experts_per_tok": 6,
        "n_group": 1,
        "topk_group": 1,
    },
    # DiffusionGemma's MoE layers size their router and experts by these, None in the default config; any counts
    # serve (the attention does not read them): the expert count shrinks to the census's 4, and ``top_k_experts``,
    # which no size rule names, is the census's 2 per token.
    "diffusion_gemma_text": {"num_experts": 128, "top_k_experts": 2, "moe_intermediate_size": 704},
    # T5Gemma 2's encoder and decoder read ``dropout_rate``, declared by the composite T5Gemma2Config (0.0) that
    # real checkpoints carry, not by these tower configs: a tower's config needs it to build alone.
    "t5gemma2_text": {"dropout_rate": 0.0},
    "t5gemma2_decoder": {"dropout_rate": 0.0},
    # Qwen4-Exp's ``indexed_attention`` layers (its default layer_types hold them) need the QSA token indexer's
    # sizes, None in the default, which its config refuses. Not the released values (unknown here): one key head
    # as QSA requires, a budget that is a multiple of the compression ratio; the exported layer is held to its own
    # module with them (heads and head width shrink like any).
    "qwen4_exp_text": {
        "indexer_n_heads": 4,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 64,
        "indexer_compress_ratio": 4,
    },
}
"""Fields the released checkpoints of a text ``model_type`` set and its default config leaves unset, though its model
cannot run without them; written into the default's text config before shrinking (dicts merged)."""
TYPE_OVERRIDES: dict[str, dict[str, Any]] = {
    # LayoutLMv3 concatenates four coordinate and two shape embeddings into the hidden width (4 c + 2 s = hidden);
    # LiLT splits its layout stream into six box embeddings of hidden // 6: a width of 96 serves both.
    "layoutlmv3": {"hidden_size": 96, "coordinate_size": 16, "shape_size": 16},
    "lilt": {"hidden_size": 96},
    # BROS's box-embedding widths are computed from the hidden width, but its default's dict carries the computed
    # values of hidden 768 back into the class: the tiny ones (hidden // 4, that // dim_bbox, hidden // heads).
    "bros": {"dim_bbox_sinusoid_emb_2d": 16, "dim_bbox_sinusoid_emb_1d": 2, "dim_bbox_projection": 16},
    # CLVP rotates max(projection_dim // (2 heads), 32) channels of each head: heads of 64 (as released: half of each).
    "clvp_encoder": {"hidden_size": 128, "num_attention_heads": 2},
    # DeBERTa's default configs leave relative attention off (positions absolute at the embeddings), which no
    # released checkpoint does: DeBERTa v1 (microsoft/deberta-base, -large) sets relative attention with c2p and p2c
    # terms and no absolute positions; v2 and v3 (microsoft/deberta-v2-xlarge, deberta-v3-base, ...) add 256 log
    # position buckets, keys shared with the content projections and a LayerNorm on the relative embeddings.
    "deberta": {"relative_attention": True, "pos_att_type": ["c2p", "p2c"], "position_biased_input": False},
    "deberta-v2": {
        "relative_attention": True,
        "pos_att_type": ["p2c", "c2p"],
        "position_biased_input": False,
        "position_buckets": 256,
        "share_att_key": True,
        "norm_rel_ebd": "layer_norm",
    },
    # Zamba's shared attention reads the hidden states concatenated with the embeddings: its width and head width
    # are derived as 2 x hidden and 2 x hidden // heads (the default's dict carries hidden 3712's values back).
    "zamba": {"attention_hidden_size": 128, "attention_head_dim": 32},
    # Reformer's axial position embeddings split the hidden width in two (their widths must sum to it; the
    # default's 64 + 192 fit its hidden 256).
    "reformer": {"axial_pos_embds_dim": [32, 32]},
    # Chameleon and Emu3 build an image-token vocabulary map at init (None in the default config; the released
    # checkpoints carry their BPE vocabulary's, ids up to 65535 / 184621): here the special tokens the model reads
    # at init, within the tiny vocabulary (text-only forwards never look up image tokens).
    "chameleon": {"vocabulary_map": {"<image>": 127}},
    "emu3": {"vocabulary_map": {"<image>": 126, "<|extra_200|>": 127}},
    # Granite 4 Vision builds one Window Q-Former projector per ``deepstack_layer_map`` pair (vision layer -> text
    # layer) at its ``downsample_rate``, both None in the default config; here one pair within the tiny towers
    # (vision layer 1, text layer 0) and the docstring's rate "1/4" (text-only forwards inject nothing).
    "granite4_vision": {"downsample_rate": "1/4", "deepstack_layer_map": [[1, 0]]},
    # TVP's capture forward runs its vision backbone on every frame (the default: a ResNet-50 over 48 frames of
    # 448 px, minutes on a CPU): the video shrunk like the text (2 frames of 64 px with an 8 px prompt pad, a ResNet
    # of one basic block per stage). The layer's attention reads the text and the frames' grid as one sequence.
    "tvp": {
        "num_frames": 2,
        "max_img_size": 64,
        "visual_prompt_size": 8,
        "backbone_config": {
            "model_type": "resnet",
            "depths": [1, 1, 1, 1],
            "hidden_sizes": [16, 16, 32, 32],
            "embedding_size": 16,
            "layer_type": "basic",
            "out_features": ["stage4"],
        },
    },
}
"""Top-level fields of a ``model_type`` set after shrinking: sizes its config ties that the rules do not know, and
settings of the released checkpoints where the default config is no released model's (DeBERTa's)."""


def _text_config(config: Any) -> Any:
    """``config``'s decoder text config (composites without one are judged by themselves)."""
    try:
        return config.get_text_config(decoder=True)
    except Exception:  # composites without a text config
        return config


def _type_defaults(text: dict[str, Any], text_type: str) -> None:
    """Write :data:`TYPE_DEFAULTS` of ``text_type`` into its text config dict (nested dicts merged)."""
    for key, value in TYPE_DEFAULTS.get(text_type, {}).items():
        if isinstance(value, dict) and isinstance(text.get(key), dict):
            text[key] = {**text[key], **value}
        elif text.get(key) is None:
            text[key] = copy.deepcopy(value)


_MODULE_DEFAULT = re.compile(r'rope_parameters\.get\("mrope_section", (\[[0-9, ]+\])\)')


def _module_defaults(text: dict[str, Any], config_class: type) -> None:
    """Write into the text config the rope settings its modeling module defaults when the config lacks them
    (Qwen2-VL's ``rope_parameters.get("mrope_section", [16, 24, 24])``: sized for the default head width, so the
    tiny config must carry it, rescaled)."""
    rope = text.get("rope_parameters")
    if not isinstance(rope, dict) or "mrope_section" in rope:
        return
    module = config_class.__module__.replace(".configuration_", ".modeling_")
    try:
        source = inspect.getsource(importlib.import_module(module))
    except (ImportError, OSError, TypeError):
        return
    found = _MODULE_DEFAULT.search(source)
    if found:
        rope["mrope_section"] = json.loads(found.group(1))


def _at(data: Mapping[str, Any], path: Sequence[str]) -> Any:
    for key in path:
        data = data[key]
    return data


def layer_kinds(config: Any) -> list[tuple[Any, ...]]:
    """Per layer of a text config: the tuple of its entries in the config's per-layer lists and its membership in
    the layer-index lists and index-keyed overrides (feed-forward and expert layouts left out)."""
    data = config.to_dict()
    count = layer_count(data)
    if not count:
        return []
    for name, member in inspect.getmembers(type(config)):  # computed per-layer lists (Jamba's layers_block_type)
        if isinstance(member, property) and name not in data and PER_LAYER_KEY.search(name):
            try:
                data[name] = getattr(config, name)
            except Exception:  # a property that needs what the config lacks is no layer kind
                continue
    columns: list[list[Any]] = []
    for key, value in sorted(data.items()):
        if NOT_A_KIND.search(key) or key in SKIP_DICTS:
            continue
        if is_index_list(key, value, count):
            columns.append([i in value for i in range(count)])
        elif is_index_dict(value, count):
            columns.append([any(str(k).isdigit() and int(k) == i for k in value) for i in range(count)])
        elif is_per_layer(key, value, count):
            columns.append([v if not isinstance(v, (list, dict)) else str(v) for v in value])
    return [tuple(column[i] for column in columns) for i in range(count)]


def _distinct(kinds: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return list(dict.fromkeys(kinds))


def _build(
    config_class: Any,
    data: Mapping[str, Any],
    layers: int,
    text_type: str,
    targets: Targets,
    path: Sequence[str],
    overrides: Mapping[str, Any] | None,
) -> Any:
    """The config class built from ``data`` shrunk for ``layers`` and ``targets``, or the exception it raised."""
    shrunk = copy.deepcopy(dict(data))
    Shrink(layers, text_type, targets).apply(shrunk, text=not path)  # the text dict: found by its model_type
    vocab = min((v for k, v in flat_items(shrunk) if k == "vocab_size" and int_value(v)), default=VOCAB)
    remap_ids(shrunk, max(vocab, 2), {})
    shrunk.update(overrides or {})
    try:
        return config_class.from_dict(shrunk)
    except Exception as exc:  # returned: the caller records it and tries another size
        return exc


def tiny_configs(
    model_type: str, *, max_layers: int = 16, overrides: Mapping[str, Any] | None = None
) -> Iterator[TinyConfig]:
    """Tiny configs of ``model_type`` the config class accepts, best first: per :data:`VARIANTS` entry, the one
    at the smallest L that keeps every layer kind (else the one keeping most). A caller whose model does not build
    from one takes the next (a codec's grouped convolutions need their widths, ...).

    Args:
        model_type: a ``model_type`` of ``transformers.CONFIG_MAPPING``.
        max_layers: the largest text layer count tried to keep every layer kind.
        overrides: top-level config fields set after shrinking.

    Raises:
        Exception: what the config class raised for the last attempt, when it accepted none (the census records
            it as the reason the type has no tiny checkpoint).
    """
    import_transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    mode = dict(MODES.get(model_type, {}))
    overrides = {**FIELDS.get(model_type, {}), **mode, **(overrides or {})}
    config_class = CONFIG_MAPPING[model_type]
    default = config_class()
    text = _text_config(default)
    text_type = str(getattr(text, "model_type", model_type) or model_type)
    data = default.to_dict()
    path = text_path(data, text_type) or ()
    _module_defaults(_at(data, path), type(text))
    if text_type in TYPE_DEFAULTS:  # the layer kinds of the config as the released checkpoints set it
        _type_defaults(_at(data, path), text_type)
        with contextlib.suppress(Exception):  # a config that needs the shrunk sizes keeps the default's kinds
            text = _text_config(config_class.from_dict(copy.deepcopy(data)))
    overrides = {**TYPE_OVERRIDES.get(model_type, {}), **(overrides or {})}
    wanted = set(layer_kinds(text))
    original = layer_count(_at(data, path)) or 2
    rejected: list[str] = []
    last: Exception | None = None
    seen: set[str] = set()
    for targets in VARIANTS:
        best: tuple[int, TinyConfig] | None = None
        first = MIN_LAYERS.get(model_type, 2)
        for layers in range(first, max(first, min(max_layers, original)) + 1):
            config = _build(config_class, data, layers, text_type, targets, path, overrides)
            if isinstance(config, Exception):  # a larger L or the next variant may satisfy the config's validation
                last = config
                rejected.append(f"L={layers} {targets}: {type(config).__name__}: {' '.join(str(config).split())[:200]}")
                continue
            have = len(wanted & set(layer_kinds(config.get_text_config(decoder=True) if path else config)))
            if best is None or have > best[0]:
                best = (have, TinyConfig(config, layers, sorted(wanted, key=str), have == len(wanted), targets))
            if have == len(wanted):
                break
        if best is None:
            continue
        candidates = [best[1]]
        if targets == VARIANTS[0] and best[1].kinds_kept and 2 * best[1].layers <= max_layers:
            # Twice the layers, same kinds: where a count of layers of one kind (Gemma 3n's kv-shared layers)
            # must leave a whole pattern before it, the model may refuse the smallest L.
            doubled = _build(config_class, data, 2 * best[1].layers, text_type, targets, path, overrides)
            if not isinstance(doubled, Exception):
                candidates.append(dataclasses.replace(best[1], config=doubled, layers=2 * best[1].layers))
        for candidate in candidates:
            key = json.dumps(candidate.config.to_dict(), sort_keys=True, default=str)
            if key not in seen:  # a variant that changed nothing here is not tried twice
                seen.add(key)
                yield dataclasses.replace(candidate, rejected=list(rejected), mode=mode)
    if not seen:
        assert last is not None  # at least one attempt ran
        raise last


def tiny_config(model_type: str, *, max_layers: int = 16, overrides: Mapping[str, Any] | None = None) -> TinyConfig:
    """The first of :func:`tiny_configs` (see the module docstring)."""
    return next(tiny_configs(model_type, max_layers=max_layers, overrides=overrides))


def save_tiny_model(config: Any, model_class: str, folder: Any, *, seed: int = 0) -> Any:
    """``save_pretrained`` of ``model_class(config)`` into ``folder`` (seeded init plus a seeded perturbation of
    every floating tensor, as :class:`posenc.checkpoints.samples.Sample` does); returns the model."""
    from posenc.checkpoints.samples import save_seeded

    transformers = import_transformers()
    cls = getattr(transformers, model_class, None)
    if cls is None:
        from posenc.census.types import model_class_for

        cls = model_class_for(getattr(config, "model_type", ""), type(config))
    return save_seeded(cls, config, folder, seed=seed, shard=None)


__all__ = [
    "FIELDS",
    "MIN_LAYERS",
    "MODES",
    "TYPE_DEFAULTS",
    "TYPE_OVERRIDES",
    "TinyConfig",
    "layer_kinds",
    "save_tiny_model",
    "tiny_config",
    "tiny_configs",
]
