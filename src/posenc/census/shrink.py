"""The size rules of the census's tiny configs (:mod:`posenc.census.tiny`): what every integer field whose name
says it is a size shrinks to, by field name, in every nested config (text, vision, audio, ...), never inside
``rope_parameters`` except ``mrope_section``:

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
- layers: the text configs' layer counts L (chosen by :mod:`posenc.census.tiny`), other configs' 2; counts of
  layers of one kind (``max_window_layers``, ``first_k_dense_replace``, ...) scaled to L; per-layer lists
  (``layer_types``, ``no_rope_layers``, ...) cut to their first L entries; layer-index lists
  (``cross_attention_layers``) and index-keyed overrides (``per_layer_config``) cut to the layers below L.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

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
PER_LAYER_KEY = re.compile(
    r"layer|types|pattern|block_type|per_layer|sparsity|rope_theta|windows|attn|^intermediate_size$"
)
NOT_A_KIND = re.compile(r"intermediate|heads|sparsity|mlp|moe|expert|dense|sparse")
"""Per-layer lists that do not make a layer kind (feed-forward and mixture-of-experts layouts)."""
_TOKEN_ID = re.compile(r"(token_id|token_index|_token|_id)$")
SKIP_DICTS = frozenset({"rope_parameters", "rope_scaling", "label2id", "id2label", "task_specific_params"})
"""Nested dicts the rules never enter (``rope_parameters`` only for ``mrope_section``)."""


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


def text_path(data: Mapping[str, Any], text_type: str) -> tuple[str, ...] | None:
    """The key path of the first nested dict whose ``model_type`` is ``text_type`` (``()``: the top level)."""
    if data.get("model_type") == text_type:
        return ()
    for key, value in data.items():
        if isinstance(value, dict) and key not in SKIP_DICTS:
            found = text_path(value, text_type)
            if found is not None:
                return (key, *found)
    return None


def int_value(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def layer_count(data: Mapping[str, Any]) -> int | None:
    counts = [v for k, v in data.items() if _LAYERS.search(k) and int_value(v)]
    return max(counts) if counts else None


def is_config_dict(key: str, value: Any) -> bool:
    return (
        isinstance(value, dict)
        and key not in SKIP_DICTS
        and bool(value)
        and all(isinstance(k, str) and k.isidentifier() for k in value)
    )


def is_width(key: str) -> bool:
    """A width field (model, head, feed-forward, latent rank): the fields :class:`Shrink` keeps equal."""
    if key in MLA or _HEAD_DIM.search(key) or _INTERMEDIATE.search(key):
        return True
    return bool(_WIDTH.search(key)) and not _NOT_A_SIZE.search(key)


def is_index_list(key: str, value: Any, layers: int) -> bool:
    """A list of layer indices (``cross_attention_layers: [3, 8, 13]``, ``moe_layers: [0, 1, ..., 47]``)."""
    return (
        isinstance(value, list)
        and bool(value)
        and bool(re.search(r"layer|idx|indices|indexes", key))
        and all(int_value(v) and 0 <= v < layers for v in value)
        and all(a < b for a, b in itertools.pairwise(value))
    )


def is_index_dict(value: Any, layers: int) -> bool:
    """Per-layer overrides keyed by layer index (``per_layer_config: {"05": {...}, "11": {...}}``)."""
    return isinstance(value, dict) and bool(value) and all(str(k).isdigit() and int(k) < layers for k in value)


def is_per_layer(key: str, value: Any, layers: int) -> bool:
    """A list with one entry per layer (``layer_types``), or a pattern string with one letter per layer
    (``hybrid_override_pattern``)."""
    shaped = isinstance(value, list) or (isinstance(value, str) and "pattern" in key)
    return shaped and len(value) == layers and bool(PER_LAYER_KEY.search(key))


def remap_ids(data: dict[str, Any], vocab: int, ids: dict[int, int]) -> None:
    """Token ids at or beyond ``vocab`` -> distinct ids at the end of the tiny vocabulary (in every nested dict)."""
    for key, value in list(data.items()):
        if is_config_dict(key, value):
            remap_ids(value, vocab, ids)
        elif _TOKEN_ID.search(key) and not isinstance(value, bool):
            if int_value(value) and value >= vocab:
                data[key] = ids.setdefault(value, vocab - 1 - len(ids) % vocab)
            elif isinstance(value, list) and all(int_value(v) for v in value):
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


class Shrink:
    """The rules of the module docstring applied to a config dict (recursively) for text layer count ``layers``."""

    def __init__(self, layers: int, text_type: str, targets: Targets) -> None:
        self.layers = layers
        self.text_type = text_type
        self.t = targets

    def apply(self, data: dict[str, Any], *, text: bool) -> None:
        text = text or data.get("model_type") == self.text_type
        if not text and self.t.text_only:  # only look for the text config inside
            for key, value in data.items():
                if is_config_dict(key, value):
                    self.apply(value, text=False)
            return
        original = layer_count(data)
        heads = next((v for k, v in data.items() if _HEADS.search(k) and not _KV_HEADS.search(k) and int_value(v)), 0)
        hidden = next((data[k] for k in ("hidden_size", "n_embd", "d_model") if int_value(data.get(k))), None)
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
        before = {k: v for k, v in data.items() if int_value(v) and is_width(k)}
        for key, value in list(data.items()):
            if original and layers and key not in SKIP_DICTS and is_index_dict(value, original):
                data[key] = {k: v for k, v in value.items() if int(k) < layers}
                # Overrides shrink to twice the tiny sizes, so that a layer's larger head stays larger (a config
                # drops an override equal to its global value, and the layer kind with it).
                double = dataclasses.replace(self.t, head_dim=2 * self.t.head_dim, intermediate=2 * self.t.intermediate)
                for inner in data[key].values():
                    if isinstance(inner, dict):
                        Shrink(self.layers, self.text_type, double).apply(inner, text=False)
            elif is_config_dict(key, value):
                self.apply(value, text=False)
            elif key == "rope_parameters" and isinstance(value, dict):
                continue  # after the widths (below): its mrope_section follows the tiny rotary width
            elif int_value(value):
                data[key] = self._int(key, value, data, heads, head_dim, original, layers, text)
            elif original and layers and is_index_list(key, value, original):
                kept = [v for v in value if v < layers]
                data[key] = kept if kept or text else [layers - 1]
            elif original and layers and is_per_layer(key, value, original):
                data[key] = self._per_layer(key, value[:layers])
        self._keep_equal(data, before)
        if isinstance(data.get("rope_parameters"), dict):
            self._rope(data["rope_parameters"], data)
        for key in [k for k, v in data.items() if v is None and _KV_HEADS.search(k)] if text and heads else []:
            data[key] = min(heads, self.t.heads)  # unset: "defaults to num_attention_heads" (Nemotron reads it)
        if text and "head_dim" in data and data["head_dim"] is None and heads and int_value(data.get("hidden_size")):
            # A head width the default leaves unset is the one the geometry implies (HunYuan's module reads it).
            data["head_dim"] = data["hidden_size"] // min(heads, self.t.heads)
        if (
            int_value(data.get("qk_nope_head_dim"))
            and int_value(data.get("qk_rope_head_dim"))
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
            if len(keys) > 1 and all(int_value(data.get(k)) for k in keys):
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
            if isinstance(factor, float) and int_value(data.get("head_dim")):
                data["head_dim"] = even_rotary_head(int(data["head_dim"]), factor)
            section = params.get("mrope_section")
            if isinstance(section, list) and all(int_value(s) for s in section):
                factor = params.get("partial_rotary_factor", data.get("partial_rotary_factor", 1.0)) or 1.0
                head = min(int(data.get("head_dim") or self.t.head_dim), self.t.head_dim)
                while int(head * factor) // 2 < len(section) and int_value(data.get("head_dim")):
                    head *= 2  # every section keeps a frequency: a wider head (Qwen3.5 rotates a quarter of it)
                    data["head_dim"] = head
                params["mrope_section"] = _mrope(section, max(len(section), int(head * factor) // 2))


def even_rotary_head(head: int, factor: float) -> int:
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


def flat_items(data: Mapping[str, Any]) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in data.items():
        items.append((key, value))
        if is_config_dict(key, value):
            items += flat_items(value)
    return items


__all__ = [
    "CONTEXT",
    "EXPERTS",
    "EXPERTS_PER_TOKEN",
    "FILTERS",
    "HEADS",
    "HEAD_DIM",
    "HIDDEN",
    "INTERMEDIATE",
    "KV_HEADS",
    "MLA",
    "NOT_A_KIND",
    "OTHER_LAYERS",
    "PER_LAYER_KEY",
    "SKIP_DICTS",
    "VARIANTS",
    "VOCAB",
    "WINDOW",
    "Shrink",
    "Targets",
    "even_rotary_head",
    "flat_items",
    "int_value",
    "is_config_dict",
    "is_index_dict",
    "is_index_list",
    "is_per_layer",
    "is_width",
    "layer_count",
    "remap_ids",
    "text_path",
]
