"""A tiny config of any transformers model type, shrunk generically from the type's own default config.

:func:`tiny_config` starts from ``CONFIG_MAPPING[model_type]()`` (transformers' defaults: the released model's
geometry, usually), turns it into a dict, shrinks every integer field whose name says it is a size, and builds the
config class again from the dict, so the config's own validation judges the result. The rules, by field name, in
every nested config (text, vision, audio, ...), never inside ``rope_parameters`` except ``mrope_section``:

- widths (``hidden_size``, ``d_model``, ``n_embd``, ``embed_dim``, ``*_hidden_size``, ``projection_dim``, ...): 64;
- attention heads (``num_attention_heads``, ``n_head``, ``*_heads``): 4; key/value heads 2 (1 stays 1, as many as
  the query heads stays so: multi-query and multi-head attention are kept);
- head widths (``head_dim``, ``d_kv``, ``*_head_dim``): 16 (MLA: rope 8, nope 16, q/kv ranks 24/32; doubled where a
  ``partial_rotary_factor`` would leave an odd rotary width);
  ``rotary_dim`` keeps its fraction of the head, ``mrope_section`` its proportions;
- feed-forward widths (``intermediate_size``, ``ffn_dim``, ``d_ff``, ``*_intermediate_size``, ...): 64;
- experts (``num_experts``, ``n_routed_experts``, ...): 4; per token 2; shared 1; expert groups 1;
- audio codecs' first convolution width (``num_filters``, doubled at every downsampling stage): 8;
- vocabularies (``vocab_size``, ``*_vocab_size``): 128, and token ids beyond it become the last ids of it;
- windows (``sliding_window``, ``attention_chunk_size``, ``local_attention``, ...): 8, in text configs;
- context (``max_position_embeddings``): 32768 (or the rope's ``original_max_position_embeddings``);
- layers: the text configs' layer counts L (below), other configs' 2; counts of layers of one kind
  (``max_window_layers``, ``first_k_dense_replace``, ...) scaled to L; per-layer lists (``layer_types``,
  ``no_rope_layers``, ...) cut to their first L entries; layer-index lists (``cross_attention_layers``) and
  index-keyed overrides (``per_layer_config``) cut to the layers below L.

L is the smallest layer count from 2 up to ``max_layers`` at which the tiny text config has every *layer kind*
the default has (a kind: the tuple of a layer's entries in the per-layer lists and index lists), so Gemma 3's
five sliding layers and one full layer shrink to six layers, not two sliding ones. Where a config's validation ties
sizes together, the next of :data:`VARIANTS` is tried (e.g. 8 heads: Mamba's heads x head width = 2 x hidden).

The tiny model is ``save_pretrained`` of the randomly initialised (seeded, perturbed) model: never downloaded.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import itertools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from posenc.checkpoints.reference import import_transformers

HIDDEN = 64
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
INTERMEDIATE = 64
VOCAB = 128
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
WINDOW = 8
CONTEXT = 32768
OTHER_LAYERS = 2
FILTERS = 8
MLA = {"kv_lora_rank": 32, "q_lora_rank": 24, "o_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16}

_NOT_A_SIZE = re.compile(
    r"position|max_|window|patch|image|mel|sample|rate|chunk|bucket|distance|token|vocab|seq|length|grid|kernel|"
    r"stride|pool|period|offset|interval|num_|_id$|index|scale|factor|temperature|theta|bins|frames"
)
_KV_HEADS = re.compile(r"(key_value|kv)_heads$|^multi_query_group_num$|^num_query_groups$")
_HEADS = re.compile(r"(^|_)heads$|^n_head$|^num_head$")
_HEAD_DIM = re.compile(r"head_?dim$|^d_kv$|head_size$|^kv_channels$|^dim_head$|(^|_)d_head$")
_INTERMEDIATE = re.compile(
    r"intermediate_size|ffn_dim$|ffn_hidden_size$|(^|_)d_ff$|^n_inner$|^d_inner$|^dim_ff$|^dff$|mlp_dim$|"
    r"linear_units$|feed_forward_size$|moe_hidden_size$|d_ssm$"
)
_EXPERTS = re.compile(r"^(num|n)_(local_|routed_)?experts$|^moe_num_experts$|^num_experts_total$")
_PER_TOKEN = re.compile(r"experts_per_tok(en)?$|^moe_topk$|^moe_top_k$|^top_k$|^moe_k$|^num_selected_experts$")
_SHARED = re.compile(r"shared_experts$")
_GROUPS = re.compile(r"^n_group$|^topk_group$|^num_expert_group$")  # Bailing hybrid: num_expert_group
_WIDTH = re.compile(
    r"hidden_size$|hidden_dim$|^d_model$|^n_embd$|embed_dim$|embedding_dim$|embedding_size$|^emb_dim$|"
    r"projection_dim$|proj_dim$|^model_dim$|^dim$|(^|_)width$|output_dim$|bottleneck_size$|^attention_hidden_size$"
)
_WINDOW = re.compile(
    r"^sliding_window(_size)?$|^attention_window(_size)?$|^local_attention(_window_len)?$|^attention_chunk_size$"
)
_LAYERS = re.compile(
    r"^(num_)?(hidden_|encoder_|decoder_)?layers$|^n_layers?$|^num_(encoder|decoder)_layers$|^depth$|"
    r"^(speech_encoder|t2u_encoder|t2u_decoder)_layers$"
)
_LAYER_RELATIVE = re.compile(r"^(?!.*(feat|conv|extract)).*layers$|^first_k_dense_replace$")
_PER_LAYER_KEY = re.compile(
    r"layer|types|pattern|block_type|per_layer|sparsity|rope_theta|windows|attn|^intermediate_size$"
)
_NOT_A_KIND = re.compile(r"intermediate|heads|sparsity|mlp|moe|expert|dense|sparse")
"""Per-layer lists that do not make a layer kind (feed-forward and mixture-of-experts layouts)."""
_TOKEN_ID = re.compile(r"(token_id|token_index|_token|_id)$")
SKIP_DICTS = frozenset({"rope_parameters", "rope_scaling", "label2id", "id2label", "task_specific_params"})
"""Nested dicts the rules never enter (``rope_parameters`` only for ``mrope_section``)."""


MODES: dict[str, dict[str, Any]] = {
    # BigBird's block-sparse attention needs sequences of at least (5 + 2 * num_random_blocks) blocks and turns to
    # full attention (with a warning, changing the module's setting) on anything shorter; 'original_full' is the
    # model's full-attention mode, chosen in config.json, whose module the capture can then call as the model does.
    "big_bird": {"attention_type": "original_full"},
    "bigbird_pegasus": {"attention_type": "original_full"},
}
"""Per-type settings a tiny config takes (each a real mode of the model, set in its config.json), where the default
mode cannot be captured on a short forward; the census's notes name them."""


FIELDS: dict[str, dict[str, Any]] = {
    # HRM's config keeps num_layers_per_stack once set and derives num_hidden_layers (its cache slots) from it;
    # unset, it takes the shrunk num_hidden_layers as the per-stack count and derives the slots from that.
    "hrm_text": {"num_layers_per_stack": None},
}
"""Per-type config fields a tiny config sets so that the shrunk sizes stay consistent (fields the rules do not
shrink, derived by the config class)."""


@dataclasses.dataclass(frozen=True)
class Targets:
    """The sizes the rules shrink to (one :data:`VARIANTS` entry changes some, where a config's validation ties
    sizes together: Mamba heads x head width = 2 x hidden, an adaptor width = hidden / 4, ...)."""

    hidden: int = HIDDEN
    heads: int = HEADS
    head_dim: int = HEAD_DIM
    intermediate: int = INTERMEDIATE
    other_layers: int | None = OTHER_LAYERS
    every_dim: bool = False
    """Also shrink every other ``*_dim`` / ``*_size`` field above ``hidden`` (conditioning widths, ...)."""
    text_only: bool = False
    """Leave the other configs (vision, audio, codec) at their defaults: the last resort, a larger checkpoint."""


VARIANTS: tuple[Targets, ...] = (
    Targets(),
    Targets(heads=8),
    Targets(other_layers=None),
    Targets(every_dim=True),
    Targets(intermediate=HIDDEN // 4),
    Targets(heads=8, other_layers=None, every_dim=True),
    Targets(text_only=True),
)
"""Tried in order at each layer count until the config class accepts one."""


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


def _text_path(data: Mapping[str, Any], text_type: str) -> tuple[str, ...] | None:
    """The key path of the first nested dict whose ``model_type`` is ``text_type`` (``()``: the top level)."""
    if data.get("model_type") == text_type:
        return ()
    for key, value in data.items():
        if isinstance(value, dict) and key not in SKIP_DICTS:
            found = _text_path(value, text_type)
            if found is not None:
                return (key, *found)
    return None


def _int_value(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _layer_count(data: Mapping[str, Any]) -> int | None:
    counts = [v for k, v in data.items() if _LAYERS.search(k) and _int_value(v)]
    return max(counts) if counts else None


def _is_config_dict(key: str, value: Any) -> bool:
    return (
        isinstance(value, dict)
        and key not in SKIP_DICTS
        and bool(value)
        and all(isinstance(k, str) and k.isidentifier() for k in value)
    )


def _is_width(key: str) -> bool:
    """A width field (model, head, feed-forward, latent rank): the fields :class:`_Shrink` keeps equal."""
    if key in MLA or _HEAD_DIM.search(key) or _INTERMEDIATE.search(key):
        return True
    return bool(_WIDTH.search(key)) and not _NOT_A_SIZE.search(key)


def _is_index_list(key: str, value: Any, layers: int) -> bool:
    """A list of layer indices (``cross_attention_layers: [3, 8, 13]``, ``moe_layers: [0, 1, ..., 47]``)."""
    return (
        isinstance(value, list)
        and bool(value)
        and bool(re.search(r"layer|idx|indices|indexes", key))
        and all(_int_value(v) and 0 <= v < layers for v in value)
        and all(a < b for a, b in itertools.pairwise(value))
    )


def _is_index_dict(value: Any, layers: int) -> bool:
    """Per-layer overrides keyed by layer index (``per_layer_config: {"05": {...}, "11": {...}}``)."""
    return isinstance(value, dict) and bool(value) and all(str(k).isdigit() and int(k) < layers for k in value)


def _is_per_layer(key: str, value: Any, layers: int) -> bool:
    """A list with one entry per layer (``layer_types``), or a pattern string with one letter per layer
    (``hybrid_override_pattern``)."""
    shaped = isinstance(value, list) or (isinstance(value, str) and "pattern" in key)
    return shaped and len(value) == layers and bool(_PER_LAYER_KEY.search(key))


def _remap_ids(data: dict[str, Any], vocab: int, ids: dict[int, int]) -> None:
    """Token ids at or beyond ``vocab`` -> distinct ids at the end of the tiny vocabulary (in every nested dict)."""
    for key, value in list(data.items()):
        if _is_config_dict(key, value):
            _remap_ids(value, vocab, ids)
        elif _TOKEN_ID.search(key) and not isinstance(value, bool):
            if _int_value(value) and value >= vocab:
                data[key] = ids.setdefault(value, vocab - 1 - len(ids) % vocab)
            elif isinstance(value, list) and all(_int_value(v) for v in value):
                data[key] = [ids.setdefault(v, vocab - 1 - len(ids) % vocab) if v >= vocab else v for v in value]


def _mrope(section: Sequence[int], half: int) -> list[int]:
    """``section`` rescaled to sum to ``half`` (largest remainders; each part at least 1)."""
    total = sum(section) or 1
    exact = [s * half / total for s in section]
    parts = [max(1, int(e)) for e in exact]
    while sum(parts) > half and max(parts) > 1:
        parts[parts.index(max(parts))] -= 1
    order = sorted(range(len(exact)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    for i in order[: max(0, half - sum(parts))]:
        parts[i] += 1
    return parts


class _Shrink:
    """The rules of the module docstring applied to a config dict (recursively) for text layer count ``layers``."""

    def __init__(self, layers: int, text_type: str, targets: Targets) -> None:
        self.layers = layers
        self.text_type = text_type
        self.t = targets

    def apply(self, data: dict[str, Any], *, text: bool) -> None:
        text = text or data.get("model_type") == self.text_type
        if not text and self.t.text_only:  # only look for the text config inside
            for key, value in data.items():
                if _is_config_dict(key, value):
                    self.apply(value, text=False)
            return
        original = _layer_count(data)
        heads = next((v for k, v in data.items() if _HEADS.search(k) and not _KV_HEADS.search(k) and _int_value(v)), 0)
        hidden = next((data[k] for k in ("hidden_size", "n_embd", "d_model") if _int_value(data.get(k))), None)
        head_dim = data.get("head_dim") or (hidden // heads if isinstance(hidden, int) and heads else None)
        if text:
            layers: int | None = self.layers
        else:
            layers = (
                self.t.other_layers
                if original is None or self.t.other_layers is None
                else min(original, self.t.other_layers)
            )
            layers = original if layers is None else layers
        before = {k: v for k, v in data.items() if _int_value(v) and _is_width(k)}
        for key, value in list(data.items()):
            if original and layers and key not in SKIP_DICTS and _is_index_dict(value, original):
                data[key] = {k: v for k, v in value.items() if int(k) < layers}
                # Overrides shrink to twice the tiny sizes, so that a layer's larger head stays larger (a config
                # drops an override equal to its global value, and the layer kind with it).
                double = dataclasses.replace(self.t, head_dim=2 * self.t.head_dim, intermediate=2 * self.t.intermediate)
                for inner in data[key].values():
                    if isinstance(inner, dict):
                        _Shrink(self.layers, self.text_type, double).apply(inner, text=False)
            elif _is_config_dict(key, value):
                self.apply(value, text=False)
            elif key == "rope_parameters" and isinstance(value, dict):
                continue  # after the widths (below): its mrope_section follows the tiny rotary width
            elif _int_value(value):
                data[key] = self._int(key, value, data, heads, head_dim, original, layers, text)
            elif original and layers and _is_index_list(key, value, original):
                kept = [v for v in value if v < layers]
                data[key] = kept if kept or text else [layers - 1]
            elif original and layers and _is_per_layer(key, value, original):
                data[key] = self._per_layer(key, value[:layers])
        self._keep_equal(data, before)
        if isinstance(data.get("rope_parameters"), dict):
            self._rope(data["rope_parameters"], data)
        for key in [k for k, v in data.items() if v is None and _KV_HEADS.search(k)] if text and heads else []:
            data[key] = min(heads, self.t.heads)  # unset: "defaults to num_attention_heads" (Nemotron reads it)
        if text and "head_dim" in data and data["head_dim"] is None and heads and _int_value(data.get("hidden_size")):
            # A head width the default leaves unset is the one the geometry implies (HunYuan's module reads it).
            data["head_dim"] = data["hidden_size"] // min(heads, self.t.heads)
        if (
            _int_value(data.get("qk_nope_head_dim"))
            and _int_value(data.get("qk_rope_head_dim"))
            and "qk_head_dim" in data
        ):
            data["qk_head_dim"] = data["qk_nope_head_dim"] + data["qk_rope_head_dim"]
        for key in ("dtype", "torch_dtype"):
            if isinstance(data.get(key), str):
                data[key] = "float32"

    @staticmethod
    def _keep_equal(data: dict[str, Any], before: Mapping[str, int]) -> None:
        """Width fields equal in the default stay equal (DeepSeek-V3's ``head_dim`` is its ``qk_rope_head_dim``,
        the rotary module reads one and the attention the other): each group takes its smallest shrunk value."""
        groups: dict[int, list[str]] = {}
        for key, value in before.items():
            groups.setdefault(value, []).append(key)
        for keys in groups.values():
            if len(keys) > 1 and all(_int_value(data.get(k)) for k in keys):
                smallest = min(data[k] for k in keys)
                for key in keys:
                    data[key] = smallest

    def _per_layer(self, key: str, value: Any) -> Any:
        if key == "intermediate_size":
            return [min(v, self.t.intermediate) for v in value]
        if "heads" in key:
            return [min(v, self.t.heads) for v in value]
        return value

    def _int(
        self,
        key: str,
        value: int,
        data: Mapping[str, Any],
        heads: int,
        head_dim: int | None,
        original: int | None,
        layers: int | None,
        text: bool,
    ) -> int:
        t = self.t
        if key in MLA:
            return min(value, MLA[key])
        if key == "num_filters":  # an audio codec's first convolution width, doubled per stage (VibeVoice: 32 -> 2048)
            return min(value, FILTERS)
        if key == "rotary_dim" and head_dim:
            return max(2, round(t.head_dim * value / head_dim) // 2 * 2)
        if _LAYERS.search(key):
            return value if layers is None else min(value, layers)
        if _LAYER_RELATIVE.search(key) and original and layers and value <= original:
            return min(layers, max(min(value, 1), round(value * layers / original)))
        if "vocab_size" in key:
            return min(value, VOCAB)
        if _KV_HEADS.search(key):
            return value if value == 1 else (t.heads if value == heads else min(KV_HEADS, t.heads))
        if _HEADS.search(key):
            return min(value, t.heads)
        if _HEAD_DIM.search(key):
            return min(value, t.head_dim)
        if _EXPERTS.search(key):
            return min(value, EXPERTS)
        if _PER_TOKEN.search(key):
            return min(value, EXPERTS_PER_TOKEN)
        if _SHARED.search(key):
            return min(value, 1)
        if _GROUPS.search(key):
            return 1
        if _INTERMEDIATE.search(key):
            return min(value, t.intermediate)
        if text and _WINDOW.search(key):
            return min(value, WINDOW)
        if text and key == "max_position_embeddings":
            rope = data.get("rope_parameters")
            original_context = rope.get("original_max_position_embeddings") if isinstance(rope, dict) else None
            return min(value, max(CONTEXT, original_context or 0))
        if _WIDTH.search(key) and not _NOT_A_SIZE.search(key):
            return min(value, t.hidden)
        if t.every_dim and re.search(r"(_dim|_size)$", key) and not _NOT_A_SIZE.search(key):
            return min(value, t.hidden)
        return value

    def _rope(self, rope: dict[str, Any], data: dict[str, Any]) -> None:
        """``mrope_section`` (in the rope parameters, or per layer type) rescaled to the tiny rotary half-width; a
        head widened where its ``partial_rotary_factor`` would give the tiny head an odd rotary width."""
        for params in [rope, *(v for v in rope.values() if isinstance(v, dict))]:
            factor = params.get("partial_rotary_factor", data.get("partial_rotary_factor"))
            if isinstance(factor, float) and _int_value(data.get("head_dim")):
                data["head_dim"] = _even_rotary_head(int(data["head_dim"]), factor)
            section = params.get("mrope_section")
            if isinstance(section, list) and all(_int_value(s) for s in section):
                factor = params.get("partial_rotary_factor", data.get("partial_rotary_factor", 1.0)) or 1.0
                head = min(int(data.get("head_dim") or self.t.head_dim), self.t.head_dim)
                while int(head * factor) // 2 < len(section) and _int_value(data.get("head_dim")):
                    head *= 2  # every section keeps a frequency: a wider head (Qwen3.5 rotates a quarter of it)
                    data["head_dim"] = head
                params["mrope_section"] = _mrope(section, max(len(section), int(head * factor) // 2))


def _even_rotary_head(head: int, factor: float) -> int:
    """``head``, doubled until ``int(head · factor)`` (transformers' rotary width) is even and at least 2.

    MiMo-V2-Flash rotates ``int(192 · 0.334) = 64`` of its 192 channels; the tiny head of 16 would rotate
    ``int(5.344) = 5``, a width no released checkpoint has (transformers then rotates 6 channels at the frequencies
    of a width of 5, and posenc's config check refuses it), so the census keeps a head of 32 (10 channels)."""
    for _ in range(4):
        width = int(head * factor)
        if width >= 2 and width % 2 == 0:
            break
        head *= 2
    return head


TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    # Step 3.5's model builds a sliding-window mask for every forward, but its default config (all layers full
    # attention) sets no window: the released checkpoints do (512); shrunk to the tiny window like any window.
    "step3p5": {"sliding_window": 512},
    # HunYuan-VL's rotary module splits the head into XD-RoPE sections (its config's ``xdrope_section``, renamed
    # ``mrope_section``), which the default config leaves unset; the released checkpoints' four equal sections,
    # rescaled to the tiny head like any ``mrope_section``.
    "hunyuan_vl_text": {"rope_parameters": {"mrope_section": [16, 16, 16, 16]}},
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
}
"""Top-level fields of a ``model_type`` set after shrinking, where its config ties sizes the rules do not know."""


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
    count = _layer_count(data)
    if not count:
        return []
    for name, member in inspect.getmembers(type(config)):  # computed per-layer lists (Jamba's layers_block_type)
        if isinstance(member, property) and name not in data and _PER_LAYER_KEY.search(name):
            try:
                data[name] = getattr(config, name)
            except Exception:  # a property that needs what the config lacks is no layer kind
                continue
    columns: list[list[Any]] = []
    for key, value in sorted(data.items()):
        if _NOT_A_KIND.search(key) or key in SKIP_DICTS:
            continue
        if _is_index_list(key, value, count):
            columns.append([i in value for i in range(count)])
        elif _is_index_dict(value, count):
            columns.append([any(str(k).isdigit() and int(k) == i for k in value) for i in range(count)])
        elif _is_per_layer(key, value, count):
            columns.append([v if not isinstance(v, (list, dict)) else str(v) for v in value])
    return [tuple(column[i] for column in columns) for i in range(count)]


def _distinct(kinds: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return list(dict.fromkeys(kinds))


def _flat(data: Mapping[str, Any]) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in data.items():
        items.append((key, value))
        if _is_config_dict(key, value):
            items += _flat(value)
    return items


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
    _Shrink(layers, text_type, targets).apply(shrunk, text=not path)  # the text dict: found by its model_type
    vocab = min((v for k, v in _flat(shrunk) if k == "vocab_size" and _int_value(v)), default=VOCAB)
    _remap_ids(shrunk, max(vocab, 2), {})
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
    try:
        text = default.get_text_config(decoder=True)
    except Exception:  # composites without a text config are judged by themselves
        text = default
    text_type = str(getattr(text, "model_type", model_type) or model_type)
    data = default.to_dict()
    path = _text_path(data, text_type) or ()
    _module_defaults(_at(data, path), type(text))
    _type_defaults(_at(data, path), text_type)
    overrides = {**TYPE_OVERRIDES.get(model_type, {}), **(overrides or {})}
    wanted = set(layer_kinds(text))
    original = _layer_count(_at(data, path)) or 2
    rejected: list[str] = []
    last: Exception | None = None
    seen: set[str] = set()
    for targets in VARIANTS:
        best: tuple[int, TinyConfig] | None = None
        for layers in range(2, max(2, min(max_layers, original)) + 1):
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
    "MODES",
    "TYPE_DEFAULTS",
    "TYPE_OVERRIDES",
    "VARIANTS",
    "Targets",
    "TinyConfig",
    "layer_kinds",
    "save_tiny_model",
    "tiny_config",
    "tiny_configs",
]
