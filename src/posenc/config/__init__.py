"""Attention geometry (:class:`AttentionConfig`) and import of a Hugging Face ``config.json``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posenc import rope_types
from posenc.config.hf_json import check_config, read_json_object
from posenc.errors import ConfigError

QK_NORMS: tuple[str, ...] = ("none", "rms", "l2", "layer")
"""Values of :attr:`AttentionConfig.qk_norm`."""
OUTPUT_GATES: tuple[str, ...] = ("none", "sigmoid", "softplus")
"""Values of :attr:`AttentionConfig.output_gate`."""


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Geometry of one attention block.

    Attributes:
        hidden_size: model width E (input and output of the block).
        num_heads: query heads H.
        num_kv_heads: key/value heads Hkv (grouped-query attention); must divide ``num_heads``.
        head_dim: per-head width D; defaults to ``hidden_size // num_heads``.
        causal: decoder (causal) or encoder (bidirectional) attention.
        max_position_embeddings: the model's context length; default ``max_positions`` of tables.
        qkv_bias: whether the q/k/v projections carry a bias.
        out_bias: whether the output projection ``o_proj`` carries a bias (GPT-NeoX ``dense``, BLOOM, BERT's
            output dense, BART/Marian ``out_proj``, Falcon with ``bias``, Llama/Qwen with ``attention_bias``).
        attn_scale: the multiplier of ``q·kᵀ``; ``None`` keeps the scheme's own (``1/√D``; T5 1; DeBERTa
            ``1/√(D·(1 + terms))``; TUPE ``1/√(2D)``). Gemma: ``query_pre_attn_scalar ** -0.5``. Every score
            path honours it (the block's, and the schemes that scale position terms or scores themselves).
        logit_softcap: Gemma 2's ``cap · tanh(scores / cap)``, applied after scaling and after any score bias,
            before the mask (``attn_logit_softcapping``); ``None``: no cap.
        sliding_window: local attention of ``w`` keys: causal blocks let query position ``i`` see key position
            ``j`` iff ``i - w < j <= i`` (transformers' ``sliding_window_overlay``: ``kv_idx > q_idx - w``);
            bidirectional blocks iff ``|i - j| < w`` (the attention module's window, e.g. ModernBERT's
            ``config.sliding_window + 1``). ``None``: no window.
        qk_norm: ``"rms"``: per-head RMSNorm over ``head_dim`` on q and k right after the projections, before
            the scheme acts (Qwen3 / Gemma 3 ``q_norm`` / ``k_norm``), with learned weights ``q_norm.weight``,
            ``k_norm.weight`` ``[head_dim]`` on the block; ``"none"``: no norm.
            ``"l2"``: the same norm without weights (Llama 4's ``Llama4TextL2Norm``, ``use_qk_norm``).
            ``"layer"``: per-head LayerNorm (mean removed) with weight and bias ``[head_dim]`` (Phi, Persimmon
            ``q_layernorm`` / ``k_layernorm``).
        qk_norm_eps: the epsilon inside that norm's square root.
        qk_norm_after_rope: apply the q/k norm after the scheme rotated q and k (HunYuan's ``query_layernorm`` /
            ``key_layernorm``, Llama 4's L2 norm) instead of before it.
        qk_norm_full_width: the RMSNorm spans the whole projection, ``H·D`` for q and ``Hkv·D`` for k, rather than
            each head (OLMo 2 / OLMo 3 / OLMoE / MiniMax-M2 ``q_norm`` over ``num_heads * head_dim``): weights
            ``q_norm.weight [H·D]``, ``k_norm.weight [Hkv·D]``; before the rotation, with ``qk_norm="rms"``.
        attention_sinks: a learned logit per query head in every softmax (gpt-oss, Granite SWA; Xiao et al.,
            "Efficient Streaming Language Models with Attention Sinks", 2023, https://arxiv.org/abs/2309.17453):
            ``softmax([scores, sink_h])`` with the sink's column dropped afterwards, so a query may give part of
            its weight to no key. Weights ``sinks [H]`` on the block.
        output_gate: a gate on the attention output before ``o_proj``, computed from the block's input by
            ``gate_proj`` (``[H·D, E]``, or ``[H, E]`` with ``output_gate_per_head``; bias with ``qkv_bias``):
            ``"sigmoid"`` (Qwen3-Next, AFMoE: Qiu et al., "Gated Attention for Large Language Models", 2025,
            https://arxiv.org/abs/2505.06708) multiplies by ``sigmoid(gate)``, ``"softplus"`` (Laguna) by
            ``softplus(gate)``; ``"none"``: no gate.
        output_gate_per_head: one gate value per head (broadcast over its ``D`` outputs) instead of one per
            output element.
        attention_chunk_size: chunked attention (Llama 4's RoPE layers, ``attention_chunk_size``): a query sees
            only keys of its own chunk, ``k_pos // c == q_pos // c`` (with causality); ``None``: no chunks.
        temperature_floor_scale: attention-temperature tuning of q (Llama 4's NoPE layers, ``floor_scale``): q at
            position p is multiplied by ``1 + temperature_scale · ln(1 + floor((p + temperature_offset) /
            floor_scale))`` before the scores; ``None``: off. Ministral 3's ``llama_4_scaling`` is the same with
            offset 0, ``original_max_position_embeddings`` as the floor scale and ``llama_4_scaling_beta``.
        temperature_scale: the ``attn_scale`` of that temperature (Llama 4: 0.1).
        temperature_offset: added to the position before the floor division (Llama 4: 1, Ministral 3: 0).
        v_norm: an RMSNorm without weights over ``head_dim`` on the values right after their projection, with
            ``qk_norm_eps`` (Gemma 4's ``v_norm``); the cache holds the normalised values.
        values_from_keys: no ``v_proj``: the values are the key projection's output before the k norm and the
            rotation (Gemma 4's ``attention_k_eq_v`` layers), then ``v_norm`` if set.
        v_head_dim: per-head width Dv of the values where it differs from ``head_dim`` (MiMo-V2-Flash: keys 192,
            values 128): ``v_proj`` ``[Hkv·Dv, E]``, ``o_proj`` ``[E, H·Dv]``, the value cache ``[B, Hkv, P, Dv]``;
            ``None``: the values are ``head_dim`` wide (:attr:`value_dim` is the width either way).
    """

    hidden_size: int = 256
    num_heads: int = 8
    # Given as None (or left out) they are derived in __post_init__, so every built config holds ints; typed as
    # ints so that every reader can use them as such (the None default is the one place that says otherwise).
    num_kv_heads: int = None  # type: ignore[assignment]  # None: derived (= num_heads) in __post_init__
    head_dim: int = None  # type: ignore[assignment]  # None: derived (= hidden_size // num_heads) in __post_init__
    causal: bool = True
    max_position_embeddings: int = 2048
    qkv_bias: bool = False
    out_bias: bool = False
    attn_scale: float | None = None
    logit_softcap: float | None = None
    sliding_window: int | None = None
    qk_norm: str = "none"
    qk_norm_eps: float = 1e-6
    qk_norm_after_rope: bool = False
    attention_chunk_size: int | None = None
    temperature_floor_scale: int | None = None
    temperature_scale: float = 0.1
    temperature_offset: int = 1
    qk_norm_full_width: bool = False
    attention_sinks: bool = False
    output_gate: str = "none"
    output_gate_per_head: bool = False
    v_norm: bool = False
    values_from_keys: bool = False
    v_head_dim: int | None = None

    def __post_init__(self) -> None:
        flags = ("causal", "qkv_bias", "out_bias", "qk_norm_after_rope", "qk_norm_full_width", "attention_sinks",
                 "output_gate_per_head", "v_norm", "values_from_keys")  # fmt: skip
        for name in flags:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"AttentionConfig.{name} must be True or False, got {getattr(self, name)!r}.")
        for name in ("hidden_size", "num_heads", "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"AttentionConfig.{name} must be a positive int, got {value!r}.")
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ConfigError(
                    f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; "
                    f"give head_dim explicitly or choose divisible sizes."
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        kv, hd = self.num_kv_heads, self.head_dim
        if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1:
            raise ConfigError(f"AttentionConfig.num_kv_heads must be a positive int, got {kv!r}.")
        if isinstance(hd, bool) or not isinstance(hd, int) or hd < 1:
            raise ConfigError(f"AttentionConfig.head_dim must be a positive int, got {hd!r}.")
        self._check_value_width()
        if self.num_heads % kv:
            raise ConfigError(
                f"num_heads {self.num_heads} is not divisible by num_kv_heads {kv}; grouped-query attention "
                f"needs each kv head to serve a whole number of query heads."
            )
        self._check_attention_options()

    def _check_attention_options(self) -> None:
        for name, meaning in (
            ("attn_scale", "the multiplier of q·kᵀ, e.g. query_pre_attn_scalar ** -0.5"),
            ("logit_softcap", "the cap of cap·tanh(scores / cap), e.g. Gemma 2's attn_logit_softcapping"),
            ("qk_norm_eps", "the RMSNorm epsilon, e.g. rms_norm_eps"),
            ("temperature_scale", "the attn_scale of Llama 4's attention-temperature tuning"),
        ):
            value = getattr(self, name)
            if value is None and name not in ("qk_norm_eps", "temperature_scale"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                unset = "" if name in ("qk_norm_eps", "temperature_scale") else ", or None for none"
                raise ConfigError(
                    f"AttentionConfig.{name} must be a finite number > 0 ({meaning}{unset}), got {value!r}."
                )
            object.__setattr__(self, name, float(value))
        for name, meaning in (
            ("sliding_window", "keys a query sees, itself included"),
            ("attention_chunk_size", "tokens per attention chunk, e.g. Llama 4's 8192"),
            ("temperature_floor_scale", "Llama 4's floor_scale, e.g. 8192"),
        ):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"AttentionConfig.{name} must be an int >= 1 ({meaning}) or None, got {value!r}.")
        offset = self.temperature_offset
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigError(
                f"AttentionConfig.temperature_offset must be an int >= 0 (Llama 4: 1, Ministral 3: 0), got {offset!r}."
            )
        if self.qk_norm not in QK_NORMS:
            raise ConfigError(
                f"AttentionConfig.qk_norm must be one of {list(QK_NORMS)} (per-head RMSNorm of q and k with or "
                f"without weights, LayerNorm, or none), "
                f"got {self.qk_norm!r}."
            )
        self._check_norm_and_gate()

    def _check_norm_and_gate(self) -> None:
        if self.qk_norm_full_width and (self.qk_norm != "rms" or self.qk_norm_after_rope):
            raise ConfigError(
                "AttentionConfig.qk_norm_full_width is an RMSNorm over the whole projection before the rotation: it "
                f"needs qk_norm='rms' without qk_norm_after_rope (got qk_norm={self.qk_norm!r}, "
                f"qk_norm_after_rope={self.qk_norm_after_rope})."
            )
        if self.output_gate not in OUTPUT_GATES:
            raise ConfigError(
                f"AttentionConfig.output_gate must be one of {list(OUTPUT_GATES)} (the activation of the gate on the "
                f"attention output), got {self.output_gate!r}."
            )
        if self.output_gate_per_head and self.output_gate == "none":
            raise ConfigError("AttentionConfig.output_gate_per_head needs an output_gate ('sigmoid' or 'softplus').")

    def _check_value_width(self) -> None:
        width = self.v_head_dim
        if width is None:
            return
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ConfigError(
                f"AttentionConfig.v_head_dim must be a positive int (the values' per-head width, e.g. MiMo-V2-Flash's "
                f"v_head_dim 128) or None for head_dim, got {width!r}."
            )
        if self.values_from_keys and width != self.head_dim:
            raise ConfigError(
                f"AttentionConfig.values_from_keys takes the values from the key projection, {self.head_dim} wide; "
                f"v_head_dim {width} cannot differ from head_dim there."
            )

    @property
    def kv_groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def value_dim(self) -> int:
        """Per-head width of the values: :attr:`v_head_dim`, else :attr:`head_dim`."""
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttentionConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown AttentionConfig field(s) {unknown}; valid fields are {sorted(known)}.")
        return cls(**dict(data))


@dataclasses.dataclass(frozen=True)
class HFImport:
    """What :func:`from_hf_config` read: the geometry plus the scheme and its parameters."""

    config: AttentionConfig
    scheme: str
    params: dict[str, Any]
    model_type: str


# Model types whose configs use RoPE even when they name no rope key (transformers' defaults apply).
_ROPE_MODEL_TYPES = frozenset(
    {
        "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
        "phi", "phi3", "gpt_neox", "gptj", "codegen", "stablelm", "olmo", "olmo2", "starcoder2", "cohere",
        "internlm2", "deepseek_v2", "deepseek_v3", "granite", "falcon", "persimmon", "glm", "mimi", "glm4",
        "helium", "ernie4_5", "ernie4_5_moe", "cohere2",
    }
)  # fmt: skip
# Model types whose modules rotate pairs (2i, 2i + 1) (transformers' rotate_every_two / interleaved cos, sin).
_INTERLEAVED_MODEL_TYPES = frozenset(
    {"gptj", "codegen", "glm", "glm4", "helium", "ernie4_5", "ernie4_5_moe", "cohere", "cohere2"}
)
# Keys that only RoPE configs carry.
_ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "rotary_emb_base", "rotary_dim", "rotary_pct",
              "partial_rotary_factor")  # fmt: skip
_SUPPORTED_FAMILIES = (
    "RoPE models (Llama, Mistral, Qwen, Phi-3, GPT-NeoX, GPT-J, Falcon, ... or any config with rope keys), "
    "ALiBi (BLOOM, MPT, Falcon with alibi), T5, DeBERTa, XLNet, learned absolute (BERT, RoBERTa, GPT-2, OPT)"
)


def from_hf_config(source: str | Path | Mapping[str, Any], layer_type: str | None = None) -> HFImport:
    """Read a Hugging Face ``config.json`` (path or dict) into geometry, scheme name and parameters.

    Supports RoPE models (``rope_parameters`` or legacy ``rope_scaling``/``rope_theta``, partial rotary,
    GPT-J/GPT-NeoX naming), ALiBi models (BLOOM, MPT, Falcon with ``alibi``), T5, DeBERTa, XLNet and
    BERT-style absolute embeddings.

    Args:
        source: ``config.json`` path, a model directory, or the parsed dict.
        layer_type: for configs whose ``rope_parameters`` differ per layer type (transformers v5, e.g.
            Gemma 3's ``full_attention`` / ``sliding_attention``), the layer type to import.

    Raises:
        ConfigError: the file cannot be read, or its positional scheme is not one posenc knows.
    """
    if isinstance(source, Mapping):
        data = dict(source)
    else:
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"  # a model directory
        if not path.exists() and not path.is_symlink():
            raise ConfigError(f"Hugging Face config {path} does not exist; pass the path of config.json.")
        data = read_json_object(path, "Hugging Face config")
    check_config(data)
    model_type = str(data.get("model_type", ""))
    overrides = _layer_overrides(data, layer_type)

    def first(*names: str, default: Any = None) -> Any:
        for name in names:
            for source in (overrides, data):
                if source.get(name) is not None:
                    return source[name]
        return default

    hidden = first("hidden_size", "n_embd", "d_model")
    heads = first("num_attention_heads", "n_head", "num_heads", "n_heads")
    if hidden is None or heads is None:
        raise ConfigError(
            "config.json lacks hidden_size/num_attention_heads (or n_embd/n_head, d_model/num_heads); "
            "is it a transformer language model config?"
        )
    kv_heads = first("num_key_value_heads", "num_kv_heads", "n_head_kv", default=heads)
    if data.get("multi_query") and not data.get("new_decoder_architecture"):
        kv_heads = 1  # Falcon's rule: multi-query means one kv head unless the new decoder architecture
    head_dim = first("head_dim", "d_kv", "d_head")
    max_pos = first("max_position_embeddings", "n_positions", "max_seq_len", "n_ctx", default=2048)
    encoders = ("bert", "roberta", "deberta", "deberta-v2", "xlnet", "modernbert")
    causal = not bool(data.get("is_encoder_decoder")) and model_type not in encoders
    config = AttentionConfig(
        hidden_size=int(hidden),
        num_heads=int(heads),
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim) if head_dim else int(hidden) // int(heads),
        causal=causal,
        max_position_embeddings=int(max_pos),
    )
    scheme, params = _hf_scheme(data, model_type, config, layer_type)
    return HFImport(config=config, scheme=scheme, params=params, model_type=model_type)


def _layer_overrides(data: Mapping[str, Any], layer_type: str | None) -> Mapping[str, Any]:
    """The geometry a config gives the layers of ``layer_type`` (transformers' ``per_layer_config``, keyed by layer
    index: Gemma 4's full-attention layers have their own ``head_dim``), or nothing."""
    per_layer, layer_types = data.get("per_layer_config"), data.get("layer_types")
    if layer_type is None or not isinstance(per_layer, Mapping) or not isinstance(layer_types, list):
        return {}
    if layer_type not in layer_types:
        return {}
    index = layer_types.index(layer_type)
    found = per_layer.get(str(index), per_layer.get(index))
    return found if isinstance(found, Mapping) else {}


def _hf_scheme(
    data: Mapping[str, Any], model_type: str, config: AttentionConfig, layer_type: str | None
) -> tuple[str, dict[str, Any]]:
    attn_config = data.get("attn_config") or {}
    if data.get("alibi") or model_type in ("bloom", "mpt") or attn_config.get("alibi"):
        params: dict[str, Any] = {}
        if model_type in ("falcon", "RefinedWeb", "RefinedWebModel"):
            params.update(scaled=True, bf16_rounding=True)  # Falcon: (q·k + alibi)·scale, alibi made in bfloat16
        if attn_config.get("alibi_bias_max") is not None:
            params["alibi_bias_max"] = float(attn_config["alibi_bias_max"])  # MPT
        return "alibi", params
    if model_type in ("t5", "mt5", "umt5", "longt5"):
        return "t5", {
            "num_buckets": int(data.get("relative_attention_num_buckets", 32)),
            "max_distance": int(data.get("relative_attention_max_distance", 128)),
            "bidirectional": not config.causal,
        }
    if model_type in ("deberta", "deberta-v2"):
        return "deberta", _deberta_params(data, config)
    if model_type == "xlnet":
        return "transformer_xl", {}
    if model_type in ("bert", "roberta", "gpt2", "opt") or data.get("position_embedding_type") == "absolute":
        return "learned", {}
    if model_type not in _ROPE_MODEL_TYPES and not any(data.get(key) is not None for key in _ROPE_KEYS):
        raise ConfigError(
            f"config.json (model_type {model_type!r}) names no positional scheme posenc can import; supported: "
            f"{_SUPPORTED_FAMILIES}. Pick the scheme by hand: posenc export SCHEME --hidden-size ... (posenc list)."
        )
    rope = dict(data.get("rope_parameters") or data.get("rope_scaling") or {})
    nested = sorted(key for key, value in rope.items() if isinstance(value, Mapping))
    if nested:
        if layer_type not in nested:
            raise ConfigError(
                f"config.json gives rope_parameters per layer type {nested}; choose one with "
                f"layer_type= (Python) or --layer-type (CLI)."
            )
        rope = dict(rope[layer_type])
    elif layer_type is not None:
        raise ConfigError(f"layer_type {layer_type!r} given, but config.json has one rope_parameters for all layers.")
    theta = rope.get("rope_theta", data.get("rope_theta", data.get("rotary_emb_base", 10000.0)))
    rope_type = rope_types.rope_type_name(rope)
    _refuse_dropped_axes(rope, rope_type)
    rope_type_to_scheme = rope_types.transformers_schemes()  # the registered types transformers defines
    if rope_type not in rope_type_to_scheme:
        raise ConfigError(
            f"rope_type {rope_type!r} in config.json is not supported; supported: {sorted(rope_type_to_scheme)}."
        )
    partial = rope.get("partial_rotary_factor", data.get("partial_rotary_factor", data.get("rotary_pct")))
    if partial is None and data.get("rotary_dim"):
        partial = int(data["rotary_dim"]) / config.head_dim
    params = {"rope_theta": float(theta)}
    if partial is not None:
        params["partial_rotary_factor"] = float(partial)
    if model_type in _INTERLEAVED_MODEL_TYPES:
        params["layout"] = "interleaved"
    # The type's own parameters are copied as given (keys another type would read are left out, as transformers
    # ignores them: HunYuan's NTK-α configs carry YaRN keys); type, theta and partial rotary were handled above.
    handled = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "max_position_embeddings"}
    keep = sorted(set(rope_types.get(rope_type).param_names) - handled)
    for key in keep:
        if rope.get(key) is not None:
            params[key] = rope[key]
    if "original_max_position_embeddings" in rope_types.get(rope_type).param_names and (
        "original_max_position_embeddings" not in params
    ):
        params["original_max_position_embeddings"] = int(
            data.get("original_max_position_embeddings", config.max_position_embeddings)
        )
    return rope_type_to_scheme[rope_type], params


def _refuse_dropped_axes(rope: Mapping[str, Any], rope_type: str) -> None:
    """A multi-axis key (M-RoPE's ``mrope_section``) next to a rope_type that is not its own would be dropped,
    silently turning 3-axis positions into 1-axis ones: refuse it."""
    for entry in map(rope_types.get, rope_types.names()):
        if entry.position_axes == 1 or entry.name == rope_type:
            continue
        for label, key in entry.claims.items():
            if rope.get(key):
                raise ConfigError(
                    f"config.json's rope_parameters carry {key!r} ({entry.title}) with rope_type {rope_type!r}; "
                    f"posenc's {entry.scheme} takes {label!r} frequencies only, so this combination cannot be "
                    f"imported. Export the scheme by hand (posenc show {entry.scheme})."
                )


def _deberta_params(data: Mapping[str, Any], config: AttentionConfig) -> dict[str, Any]:
    """DeBERTa-v2/v3 relative-attention settings (transformers' ``DisentangledSelfAttention``)."""
    kinds = data.get("pos_att_type") or []
    kinds = [kind.strip() for kind in (kinds.split("|") if isinstance(kinds, str) else kinds)]
    if not data.get("relative_attention") or not kinds or not set(kinds) <= {"c2p", "p2c"}:
        raise ConfigError(
            f"this DeBERTa config uses relative_attention={data.get('relative_attention')!r}, "
            f"pos_att_type={kinds!r}; posenc's deberta scheme is relative attention with c2p and/or p2c terms."
        )
    buckets = int(data.get("position_buckets", -1))
    max_relative = int(data.get("max_relative_positions", -1))
    norms = [part.strip() for part in str(data.get("norm_rel_ebd", "none")).lower().split("|")]
    return {
        "position_buckets": max(buckets, 0),
        "max_relative_positions": max_relative if max_relative > 0 else config.max_position_embeddings,
        "pos_att_type": "|".join(kind for kind in ("c2p", "p2c") if kind in kinds),
        "share_att_key": bool(data.get("share_att_key", False)),
        "rel_norm": "layer_norm" in norms,
        "rel_norm_eps": float(data.get("layer_norm_eps", 1e-7)),
    }
