"""A Hugging Face ``config.json``, read within bounds and checked field by field before anything computes with it.

Every way posenc reads a checkpoint's config — a checkpoint folder (:mod:`posenc.checkpoints.source`), an in-memory
model's config, ``--hf-config`` (:func:`posenc.config.from_hf_config`) — passes it through :func:`check_config`,
and every file through :func:`read_json_object` first. A value of the wrong type, outside its range, or
inconsistent with another field is refused with one line naming the field, the value and what is expected
(a :class:`~posenc.errors.ConfigError`), before transformers or posenc divides by it, truncates it or indexes
with it:

- sizes (``hidden_size``, head counts, ``head_dim``, ``max_position_embeddings``, layer counts, ...) are integers
  (not ``true``, not ``4.7``, not ``"two"``) and positive; ``num_attention_heads`` is a multiple of
  ``num_key_value_heads``;
- ``rope_theta`` and the other frequency parameters are finite positive numbers; ``partial_rotary_factor`` is in
  ``(0, 1]`` and gives an even rotary width of at least 2 (``int(head_dim · factor)``, as transformers computes it);
- ``rope_parameters`` / ``rope_scaling`` are objects (flat, or one object per layer type), their ``mrope_section``
  a list of integers whose sum is half the rotary width, their ``short_factor`` / ``long_factor`` lists of finite
  positive numbers;
- ``layer_types`` is a list of known layer kinds (transformers' ``ALLOWED_LAYER_TYPES``) with one entry per layer;
- values that change the math are refused where transformers' module would compute something else than what the
  field names: ``attn_logit_softcapping: 0`` (transformers divides the scores by it, so every score becomes 0 —
  no soft-cap is "dropped" silently) and ``query_pre_attn_scalar: 0`` (transformers raises ZeroDivisionError on
  ``0 ** -0.5``) must be positive, or null for "none".

Fields a config does not carry, or carries as ``null``, are left to the model's defaults. The checks apply to the
top level, to a wrapper's ``text_config`` and to each entry of ``per_layer_config``; a wrapper's top-level field
that its ``text_config`` sets too is checked there only (the top-level one describes another part of the model).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from posenc.artifacts.paths import input_file
from posenc.errors import ConfigError

__all__ = ["MAX_CONFIG_BYTES", "MAX_DEPTH", "check_config", "read_json_object"]

MAX_CONFIG_BYTES = 16 << 20
"""Largest config.json (or shard index) read: real ones are kilobytes, the largest indexes a few megabytes."""
MAX_DEPTH = 64
"""Deepest nesting of objects and arrays accepted in a JSON file (real configs nest 4 or 5 levels)."""

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _depth(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` in a JSON text (strings stripped first): linear, no recursion."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = deepest = 0
    for char in brackets:
        depth += 1 if char in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def read_json_object(path: str | Path, what: str, *, error: type[Exception] = ConfigError) -> dict[str, Any]:
    """The JSON object in ``path``, read only if it is a regular file of at most :data:`MAX_CONFIG_BYTES` nested at
    most :data:`MAX_DEPTH` deep.

    Raises:
        ConfigError (or ``error``): not a regular file, too large, too deep, not JSON, or not an object.
    """
    checked = input_file(path, what, error=error)
    size = checked.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise error(
            f"{what} {checked} is {size / 2**20:.1f} MiB; a config or index is at most "
            f"{MAX_CONFIG_BYTES >> 20} MiB. Pass the checkpoint's own file."
        )
    try:
        text = checked.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{what} {checked} is not valid JSON ({exc}); pass a Hugging Face checkpoint's file.") from None
    depth = _depth(text)
    if depth > MAX_DEPTH:
        raise error(
            f"{what} {checked} nests {depth} levels deep; a config nests a few levels (at most {MAX_DEPTH} are "
            f"read). Pass the checkpoint's own file."
        )
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise error(f"{what} {checked} is not valid JSON ({exc}); pass a Hugging Face checkpoint's file.") from None
    if not isinstance(data, dict):
        raise error(f"{what} {checked} holds a JSON {type(data).__name__}, not an object; pass a config.json.")
    return data


# --------------------------------------------------------------------------------------------------
# Field rules
# --------------------------------------------------------------------------------------------------

Rule = Callable[[Any], str | None]
"""A value -> ``None`` when it is acceptable, else what is expected (for the message)."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def positive_int(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    if ok:
        return None
    if isinstance(value, (list, dict)):
        return "a positive integer (one per model: posenc does not load models with per-stage lists of sizes)"
    return "a positive integer"


def layer_counts(value: Any) -> str | None:
    """A layer count: a positive integer, or per-stage positive integers keyed by stage (LXMERT's config derives
    ``{"language": l_layers, "vision": r_layers, "cross_encoder": x_layers}``; the traced path reads the stage's own
    field)."""
    if isinstance(value, dict) and value and all(positive_int(v) is None for v in value.values()):
        return None
    return positive_int(value)


def count(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return None if ok else "a non-negative integer"


def integer(value: Any) -> str | None:
    return None if isinstance(value, int) and not isinstance(value, bool) else "an integer"


def positive(value: Any) -> str | None:
    ok = _number(value) and math.isfinite(value) and value > 0
    return None if ok else "a finite positive number"


def finite(value: Any) -> str | None:
    return None if _number(value) and math.isfinite(value) else "a finite number"


def fraction(value: Any) -> str | None:
    ok = _number(value) and math.isfinite(value) and 0 < value <= 1
    return None if ok else "a number in (0, 1]"


def flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def text(value: Any) -> str | None:
    return None if isinstance(value, str) else "a string"


def positive_list(value: Any) -> str | None:
    ok = isinstance(value, list) and value and all(positive(v) is None for v in value)
    return None if ok else "a non-empty list of finite positive numbers"


def section_list(value: Any) -> str | None:
    ok = isinstance(value, list) and value and all(count(v) is None for v in value)
    return None if ok else "a non-empty list of non-negative integers"


def _cap(value: Any) -> str | None:
    if positive(value) is None:
        return None
    return (
        "a finite positive number, or null for none (transformers divides the scores by it: 0 makes every score 0, "
        "not an unlimited cap)"
    )


def _scalar(value: Any) -> str | None:
    if positive(value) is None:
        return None
    return "a finite positive number, or null for head_dim (transformers scales scores by its -1/2 power)"


SIZES = (
    "hidden_size", "n_embd", "d_model", "num_attention_heads", "n_head", "num_heads", "n_heads",
    "num_key_value_heads", "num_kv_heads", "n_head_kv", "head_dim", "d_kv", "d_head", "max_position_embeddings",
    "n_positions", "max_seq_len", "n_ctx", "num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers",
    "rotary_dim", "original_max_position_embeddings", "relative_attention_num_buckets",
    "relative_attention_max_distance", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
    "v_head_dim", "attention_chunk_size",
)  # fmt: skip
"""Integer sizes posenc reads from a config (any spelling of the model families it loads)."""

FIELDS: dict[str, Rule] = {
    **dict.fromkeys(SIZES, positive_int),
    "num_hidden_layers": layer_counts,
    # 0: unset (head_dim: hidden_size // heads, as posenc reads it; MLA ranks and widths: that part is absent)
    **dict.fromkeys(("head_dim", "d_kv", "d_head", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim"), count),
    **dict.fromkeys(("qk_nope_head_dim", "v_head_dim"), count),
    "sliding_window": count,  # 0 and null: no window (posenc's and the families' reading)
    "position_buckets": integer,  # DeBERTa: -1 for none
    "max_relative_positions": integer,
    "rope_theta": positive,
    "rotary_emb_base": positive,
    "partial_rotary_factor": fraction,
    "rotary_pct": fraction,
    "attn_logit_softcapping": _cap,
    "query_pre_attn_scalar": _scalar,
    "attention_multiplier": finite,
    "layer_norm_eps": positive,
    "rms_norm_eps": positive,
    "layer_norm_epsilon": positive,
    "model_type": text,
}
"""Top-level (and ``text_config`` / ``per_layer_config``) fields and their rules; ``null`` always passes."""

ROPE_FIELDS: dict[str, Rule] = {
    "rope_type": text,
    "type": text,
    "rope_theta": positive,
    "factor": positive,
    "partial_rotary_factor": fraction,
    "original_max_position_embeddings": positive_int,
    "max_position_embeddings": positive_int,
    "low_freq_factor": positive,
    "high_freq_factor": positive,
    "beta_fast": finite,
    "beta_slow": finite,
    "attention_factor": finite,
    "mscale": finite,
    "mscale_all_dim": finite,
    "alpha": positive,
    "short_factor": positive_list,
    "long_factor": positive_list,
    "mrope_section": section_list,
    "mrope_interleaved": flag,
    "truncate": flag,
}
"""``rope_parameters`` / ``rope_scaling`` fields and their rules."""

_ROPE_KEYS = ("rope_parameters", "rope_scaling")


def _refuse(field: str, value: Any, expected: str) -> ConfigError:
    shown = json.dumps(value) if isinstance(value, (bool, int, float, str, type(None))) else repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ConfigError(f"config.json field {field} is {shown}; expected {expected}. Fix the checkpoint's config.json.")


def _check_fields(data: Mapping[str, Any], rules: Mapping[str, Rule], where: str) -> None:
    for name, rule in rules.items():
        value = data.get(name)
        if value is None:
            continue
        expected = rule(value)
        if expected is not None:
            raise _refuse(f"{where}{name}", value, expected)


def _first(data: Mapping[str, Any], *names: str) -> Any:
    return next((data[n] for n in names if data.get(n) is not None), None)


def check_config(data: Mapping[str, Any], where: str = "") -> Mapping[str, Any]:
    """``data`` (a parsed ``config.json``) when every field posenc uses has the right type, range and consistency
    (see the module docstring); ``where`` prefixes field names in messages (``text_config.``).

    Raises:
        ConfigError: naming the first offending field, its value and what is expected.
    """
    if not isinstance(data, Mapping):
        raise _refuse(where.rstrip(".") or "(the whole file)", data, "an object")
    _check_fields(data, _own_fields(data, where), where)
    heads = _first(data, "num_attention_heads", "n_head", "num_heads", "n_heads")
    kv_heads = _first(data, "num_key_value_heads", "num_kv_heads", "n_head_kv")
    if heads is not None and kv_heads is not None and heads % kv_heads:
        raise ConfigError(
            f"config.json field {where}num_key_value_heads is {kv_heads}, which does not divide "
            f"{where}num_attention_heads {heads}; expected a divisor (each kv head serves a whole group of query "
            f"heads). Fix the checkpoint's config.json."
        )
    hidden = _first(data, "hidden_size", "n_embd", "d_model")
    head_dim = _first(data, "head_dim", "d_kv", "d_head") or None
    if head_dim is None and hidden is not None and heads is not None:
        if hidden < heads:
            raise ConfigError(
                f"config.json field {where}hidden_size is {hidden}, less than {where}num_attention_heads {heads}: "
                f"the head width hidden_size // heads would be 0; expected at least one feature per head."
            )
        head_dim = hidden // heads
    _check_layer_types(data, where)
    for key in _ROPE_KEYS:
        if data.get(key) is not None:
            _check_rope(data, key, where, head_dim)
    _check_partial(data, data, where, head_dim)
    per_layer = data.get("per_layer_config")
    if per_layer is not None:
        if not isinstance(per_layer, Mapping):
            raise _refuse(f"{where}per_layer_config", per_layer, "an object of per-layer settings")
        for index, entry in per_layer.items():
            if not isinstance(entry, Mapping):
                raise _refuse(f"{where}per_layer_config.{index}", entry, "an object")
            _check_fields(entry, FIELDS, f"{where}per_layer_config.{index}.")
    text_config = data.get("text_config")
    if text_config is not None and not where:
        if not isinstance(text_config, Mapping):
            raise _refuse("text_config", text_config, "an object (the text model's config)")
        check_config(text_config, "text_config.")
    return data


def _own_fields(data: Mapping[str, Any], where: str) -> Mapping[str, Rule]:
    """The rules of :data:`FIELDS` for ``data``; at a wrapper's top level, without the fields its ``text_config``
    sets too: posenc reads the text model's value there (checked), and the wrapper's own one belongs to another of
    its parts (MusicFlamingo sets its top-level ``max_position_embeddings`` to its audio rotary's theta, 1200.0)."""
    text_config = data.get("text_config")
    if where or not isinstance(text_config, Mapping):
        return FIELDS
    return {name: rule for name, rule in FIELDS.items() if text_config.get(name) is None}


def _check_layer_types(data: Mapping[str, Any], where: str) -> None:
    kinds = data.get("layer_types")
    if kinds is None:
        return
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise _refuse(f"{where}layer_types", kinds, "a list of layer kind names, one per layer")
    known = _known_layer_types()
    unknown = sorted({k for k in kinds if k not in known})
    if unknown:
        raise ConfigError(
            f"config.json field {where}layer_types holds {unknown}; expected kinds transformers knows "
            f"({', '.join(sorted(known))}). Fix the checkpoint's config.json."
        )
    layers = _first(data, "num_hidden_layers", "n_layer", "num_layers")
    if layers is not None and len(kinds) != layers:
        raise ConfigError(
            f"config.json field {where}layer_types lists {len(kinds)} layers, but {where}num_hidden_layers is "
            f"{layers}; expected one entry per layer. Fix the checkpoint's config.json."
        )


_FALLBACK_LAYER_TYPES = (
    "full_attention", "sliding_attention", "chunked_attention", "window_attention", "indexed_attention",
    "compressed_sparse_attention", "heavily_compressed_attention", "minimax_m3_sparse", "conv", "moe", "hybrid",
    "hybrid_sliding", "reference_sliding_attention", "linear_attention", "sparse", "dense",
)  # fmt: skip
"""transformers 5.23's ``ALLOWED_LAYER_TYPES``, for when transformers is not installed (--hf-config needs none)."""


def _known_layer_types() -> frozenset[str]:
    """transformers' ``ALLOWED_LAYER_TYPES`` (:data:`_FALLBACK_LAYER_TYPES` without transformers)."""
    try:
        from transformers.configuration_utils import ALLOWED_LAYER_TYPES
    except ImportError:
        return frozenset(_FALLBACK_LAYER_TYPES)
    return frozenset(ALLOWED_LAYER_TYPES)


def _check_rope(data: Mapping[str, Any], key: str, where: str, head_dim: int | None) -> None:
    rope = data[key]
    if not isinstance(rope, Mapping):
        raise _refuse(f"{where}{key}", rope, "an object (rope_type, rope_theta, ...), or one per layer type")
    nested = [k for k, v in rope.items() if isinstance(v, Mapping)]
    if nested:  # one object per layer type (or per attention kind: DeepSeek-V4's "main" / "compress"); null: no RoPE
        flat = sorted(k for k, v in rope.items() if k not in nested and v is not None)
        if flat:
            raise ConfigError(
                f"config.json field {where}{key} mixes per-layer-type objects ({sorted(nested)}) with plain fields "
                f"({flat}); expected one or the other. Fix the checkpoint's config.json."
            )
        for kind in nested:
            _check_rope_entry(data, rope[kind], f"{where}{key}.{kind}.", head_dim)
        return
    _check_rope_entry(data, rope, f"{where}{key}.", head_dim)


def _check_rope_entry(data: Mapping[str, Any], rope: Mapping[str, Any], where: str, head_dim: int | None) -> None:
    _check_fields(rope, ROPE_FIELDS, where)
    width = _check_partial(data, rope, where, head_dim)
    section = rope.get("mrope_section")
    if section is not None and width is not None and 2 * sum(section) != width:
        raise ConfigError(
            f"config.json field {where}mrope_section is {section} (sum {sum(section)}); expected sections summing "
            f"to half the rotary width {width}, i.e. {width // 2}. Fix the checkpoint's config.json."
        )


def _check_partial(
    data: Mapping[str, Any], where_found: Mapping[str, Any], where: str, head_dim: int | None
) -> int | None:
    """The rotary width ``int(head_dim · partial_rotary_factor)`` (transformers' rounding) when known; refuses an odd
    width or one below 2."""
    if head_dim is None:
        return None
    factor = _first(where_found, "partial_rotary_factor", "rotary_pct")
    if factor is None:
        factor = _first(data, "partial_rotary_factor", "rotary_pct")
    if factor is None:
        return head_dim
    width = int(head_dim * factor)
    if width < 2 or width % 2:
        raise ConfigError(
            f"config.json field {where}partial_rotary_factor is {factor}: head_dim {head_dim} x {factor} gives a "
            f"rotary width of {width}; expected a factor giving an even width of at least 2. Fix the checkpoint's "
            f"config.json."
        )
    return width
