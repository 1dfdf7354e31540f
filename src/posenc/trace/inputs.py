"""What a model's capture forward needs besides token ids: a declarative table per ``model_type``.

The capture (:func:`posenc.trace.calls._run_forward`) runs the model on a few token ids. Some models refuse to run on
token ids alone, though the inputs they also want never reach the layer's attention as anything but what the unit
rebuilds: document models want boxes (all-zero boxes: a page without layout; they enter at the embeddings, where the
embedding step rebuilds all-zero ids as zeros), X-MOD a language (its adapters sit after the attention), a MusicGen
decoder one row of ids per codebook. :data:`CAPTURE_INPUTS` says, per ``model_type`` (the config the capture builds:
a tower's or a stack's own), what to pass and why; :func:`capture_inputs` builds it for a capture of ``tokens``
tokens. An argument that does reach the attention (a box bias, image states) is still classified by
:mod:`posenc.trace.arguments` and refused by name where the unit cannot rebuild it, and the recorded call is still
checked against the model's own (:func:`posenc.trace.probe._probe`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class CaptureInputs:
    """Extra inputs of one model type's capture forward.

    Attributes:
        extra: keyword -> ``make(hf, tokens)``, the value passed (seeded zeros: no layout, no image, language 0).
        ids: ``shape(hf, tokens)`` of the token ids, where not ``[1, tokens]`` (MusicGen: one row per codebook).
        why: what the model needs them for (the reason the entry exists).
    """

    extra: dict[str, Callable[[Any, int], Any]] = dataclasses.field(default_factory=dict)
    ids: Callable[[Any, int], tuple[int, ...]] | None = None
    why: str = ""


def _boxes(width: int, dtype: torch.dtype = torch.int64) -> Callable[[Any, int], torch.Tensor]:
    """All-zero boxes ``[1, tokens, width]`` (a page without layout)."""
    return lambda hf, tokens: torch.zeros(1, tokens, width, dtype=dtype)


def _codebook_rows(hf: Any, tokens: int) -> tuple[int, ...]:
    return (int(getattr(hf, "num_codebooks", 1) or 1), tokens)


CAPTURE_INPUTS: dict[str, CaptureInputs] = {
    "bros": CaptureInputs(
        {"bbox": lambda hf, tokens: torch.zeros(1, tokens, int(getattr(hf, "dim_bbox", 8) or 8))},
        why="BROS refuses to run without boxes (float coordinates, dim_bbox per token)",
    ),
    "layoutlmv3": CaptureInputs(
        {"bbox": _boxes(4)}, why="LayoutLMv3 embeds boxes (x0, y0, x1, y1) beside the tokens; zeros: no layout"
    ),
    "lilt": CaptureInputs({"bbox": _boxes(4)}, why="LiLT's layout stream embeds boxes (x0, y0, x1, y1); zeros"),
    "udop": CaptureInputs(
        {"bbox": lambda hf, tokens: torch.zeros(1, tokens, 4)},
        why="UDOP's encoder needs boxes for its 2-D relative bias (float coordinates); zeros: no layout",
    ),
    "xmod": CaptureInputs(
        {"lang_ids": lambda hf, tokens: torch.zeros(1, dtype=torch.int64)},
        why="X-MOD routes every layer's output through a language adapter (after the attention); language 0",
    ),
    "t5gemma2_decoder": CaptureInputs(
        {"encoder_hidden_states": lambda hf, tokens: torch.zeros(1, tokens, int(hf.hidden_size))},
        why="T5Gemma 2's decoder refuses to run without encoder states (its attention merges them with its own)",
    ),
    "idefics": CaptureInputs(
        {
            "image_encoder_embeddings": lambda hf, tokens: torch.zeros(1, 1, 1, int(hf.vision_config.embed_dim)),
            "image_attention_mask": lambda hf, tokens: torch.ones(1, tokens, 1, dtype=torch.int64),
        },
        why="IDEFICS refuses to run without images; one zero image state (its gated cross-attention layers read it, "
        "its self-attention does not)",
    ),
    "kyutai_speech_to_text": CaptureInputs(
        ids=lambda hf, tokens: (1, tokens, int(hf.num_codebooks) + 1),
        why="Kyutai STT reads one text id and one id per audio codebook at each step, [B, S, 1 + num_codebooks]",
    ),
    "musicgen_decoder": CaptureInputs(
        ids=_codebook_rows, why="a MusicGen decoder reads one row of ids per codebook, [B * num_codebooks, S]"
    ),
    "musicgen_melody_decoder": CaptureInputs(
        ids=_codebook_rows, why="a MusicGen-Melody decoder reads one row of ids per codebook, [B * num_codebooks, S]"
    ),
}
"""Extra capture inputs per ``model_type`` (see the module docstring)."""


ONE_STREAM: dict[str, str] = {
    "vilt": "ViLT's embeddings concatenate the text tokens and the image patches into one sequence",
    "tvp": "TVP's embeddings concatenate a text prompt, the text tokens and the video frames' patches into one "
    "sequence",
}
"""Models whose layers attend over text and another modality in one sequence: the layer's input is not the text's
embeddings, and a unit fed text alone would not be what the model computes; refused before the capture with the
reason (:func:`capture_refusal`)."""


def capture_refusal(hf: Any) -> str | None:
    """Why a ``hf`` model's attention cannot be captured on text (:data:`ONE_STREAM`), or None."""
    reason = ONE_STREAM.get(str(getattr(hf, "model_type", "")))
    if reason is None:
        return None
    return (
        f"{reason}, which every layer's attention reads; posenc's unit takes text tokens and their positions only, "
        f"so the {hf.model_type} model's attention cannot be traced."
    )


ARGUMENT_MEANINGS: dict[str, str] = {
    "rel_pos": "a learned relative position bias the encoder computes once from the positions and hands every "
    "layer (LayoutLMv3's)",
    "rel_2d_pos": "a learned 2-D relative bias computed from the boxes (LayoutLMv3's)",
    "position_bias": "a relative position bias the stack computes before its layers and hands every layer "
    "(UDOP's encoder: T5's bucketed bias plus a 2-D bias from the boxes)",
    "layout_inputs": "the layout stream's states, computed from the boxes, a second input of every attention (LiLT)",
    "bbox_pos_emb": "relative box embeddings [S, S, B, D] computed from the boxes (BROS)",
    "rotary_pos_emb": "rotation angles of positions 0 .. S - 1, which its model computes from the sequence length "
    "and not from position ids (CLVP's)",
    "encoder_hidden_states": "the encoder's states, attended in the same softmax as the decoder's own tokens "
    "(merged self- and cross-attention: T5Gemma 2's decoder)",
    "past_buckets_states": "Reformer's cache (ReformerDynamicCache) of LSH bucket ids and hidden states, not of keys "
    "and values: its local and LSH attentions recompute keys from the cached states, chunk by chunk",
}
"""What an attention argument posenc cannot rebuild is, by its name: the refusal says it
(:func:`posenc.trace.arguments.classify`). The unit's inputs are the hidden states, positions and cache; these are
computed from other inputs (boxes, an encoder) or by the model outside the layer."""


def argument_meaning(key: str) -> str:
    """``", <what it is>"`` for an argument named in :data:`ARGUMENT_MEANINGS`, else ``""``."""
    meaning = ARGUMENT_MEANINGS.get(key)
    return f", {meaning}" if meaning else ""


SUBSTITUTED: frozenset[str] = frozenset(name for entry in CAPTURE_INPUTS.values() for name in entry.extra)
"""The inputs the capture fills in for a model (boxes, images, a language): data of the user's, not positions. A
tensor the model derives from one of them is not something the unit may compute from the sequence alone."""


def capture_inputs(hf: Any, tokens: int) -> tuple[tuple[int, ...], dict[str, Any]]:
    """``(shape of the token ids, extra keyword inputs)`` of the capture forward of a ``hf`` model on ``tokens``
    tokens (:data:`CAPTURE_INPUTS`; ``(1, tokens)`` and none for any other type)."""
    entry = CAPTURE_INPUTS.get(str(getattr(hf, "model_type", "")))
    if entry is None:
        return (1, tokens), {}
    shape = entry.ids(hf, tokens) if entry.ids is not None else (1, tokens)
    return shape, {key: make(hf, tokens) for key, make in entry.extra.items()}


__all__ = [
    "ARGUMENT_MEANINGS",
    "CAPTURE_INPUTS",
    "ONE_STREAM",
    "SUBSTITUTED",
    "CaptureInputs",
    "argument_meaning",
    "capture_inputs",
    "capture_refusal",
]
