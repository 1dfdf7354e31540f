"""What a model's capture forward needs besides token ids: a declarative table per ``model_type``.

The capture (:func:`posenc.trace.calls._run_forward`) runs the model on a few token ids. Some models refuse to run on
token ids alone, though the inputs they also want never reach the layer's attention as anything but what the unit
rebuilds: document models want boxes (seeded boxes in the model's range, which the unit takes as its input
``bbox``: :mod:`posenc.trace.boxes`), X-MOD a language (its adapters sit after the attention), a MusicGen
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

from posenc.trace.boxes import capture_boxes
from posenc.trace.caches import new_cache


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


SOURCE_EXTRA = 3
"""Encoder states a capture feeds beyond its tokens (a stream of its own length, :data:`STREAM_LENGTHS`, is told
apart from the tokens by it)."""


def _seeded(*shape: int) -> torch.Tensor:
    """Seeded standard-normal states (encoder states a capture feeds: zeros would give keys and values of zero)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(4))


def _codebook_rows(hf: Any, tokens: int) -> tuple[int, ...]:
    return (int(getattr(hf, "num_codebooks", 1) or 1), tokens)


CAPTURE_INPUTS: dict[str, CaptureInputs] = {
    "bros": CaptureInputs({"bbox": capture_boxes}, why="BROS refuses to run without boxes (normalised, 0 .. 1)"),
    "layoutlmv3": CaptureInputs({"bbox": capture_boxes}, why="LayoutLMv3 embeds boxes (x0, y0, x1, y1, 0 .. 1000)"),
    "lilt": CaptureInputs({"bbox": capture_boxes}, why="LiLT's layout stream embeds boxes (x0, y0, x1, y1)"),
    "udop": CaptureInputs(
        {"bbox": capture_boxes}, why="UDOP's encoder needs boxes for its 2-D relative bias (normalised, 0 .. 1)"
    ),
    "xmod": CaptureInputs(
        {"lang_ids": lambda hf, tokens: torch.zeros(1, dtype=torch.int64)},
        why="X-MOD routes every layer's output through a language adapter (after the attention); language 0",
    ),
    "t5gemma2_decoder": CaptureInputs(
        {"encoder_hidden_states": lambda hf, tokens: _seeded(1, tokens + SOURCE_EXTRA, int(hf.hidden_size))},
        why="T5Gemma 2's decoder refuses to run without encoder states (its attention merges them with its own): "
        "seeded ones, longer than the tokens, so the capture tells their length and values from the tokens'",
    ),
    "idefics": CaptureInputs(
        {
            "image_encoder_embeddings": lambda hf, tokens: torch.zeros(1, 1, 1, int(hf.vision_config.embed_dim)),
            "image_attention_mask": lambda hf, tokens: torch.ones(1, tokens, 1, dtype=torch.int64),
        },
        why="IDEFICS refuses to run without images; one zero image state (its gated cross-attention layers read it, "
        "its self-attention does not)",
    ),
    "blt": CaptureInputs(
        {"use_cache": lambda hf, tokens: False},
        why="BLT's forward cannot build its cache from its config (transformers' DynamicCache(config=...) reads a "
        "num_hidden_layers that BltConfig, one config per part, lacks): captured without one",
    ),
    "lxmert": CaptureInputs(
        {
            "visual_feats": lambda hf, tokens: torch.zeros(1, 1, int(hf.visual_feat_dim)),
            "visual_pos": lambda hf, tokens: torch.zeros(1, 1, int(hf.visual_pos_dim)),
        },
        why="LXMERT refuses to run without region features and boxes; one zero region (its language layers, which "
        "run first, never read it; its vision and cross-modality stages do)",
    ),
    "fsmt": CaptureInputs(
        {
            "encoder_hidden_states": lambda hf, tokens: torch.zeros(1, tokens, int(hf.d_model)),
            "encoder_padding_mask": lambda hf, tokens: None,
            "decoder_padding_mask": lambda hf, tokens: None,
            "decoder_causal_mask": lambda hf, tokens: None,
            "past_key_values": lambda hf, tokens: new_cache("encoder-decoder"),
        },
        why="FSMT's decoder requires its encoder's states, padding masks and causal mask (positional parameters); "
        "FSMTModel passes it an EncoderDecoderCache and no masks when use_cache is on (its default), and so does "
        "the capture (its encoder takes none of these: left out of its call)",
    ),
    "kyutai_speech_to_text": CaptureInputs(
        ids=lambda hf, tokens: (1, tokens, int(hf.num_codebooks) + 1),
        why="Kyutai STT reads one text id and one id per audio codebook at each step, [B, S, 1 + num_codebooks]",
    ),
    "vilt": CaptureInputs(
        {"pixel_values": lambda hf, tokens: torch.zeros(1, int(hf.num_channels), hf.image_size, hf.image_size)},
        why="ViLT refuses to run without an image; one zero image (its patches join the text in one sequence)",
    ),
    "tvp": CaptureInputs(
        {
            "pixel_values": lambda hf, tokens: torch.zeros(
                1, int(hf.num_frames), 3, int(hf.max_img_size), int(hf.max_img_size)
            )
        },
        why="TVP refuses to run without video frames; zero frames (their patches join the text in one sequence)",
    ),
    "musicgen_decoder": CaptureInputs(
        ids=_codebook_rows, why="a MusicGen decoder reads one row of ids per codebook, [B * num_codebooks, S]"
    ),
    "musicgen_melody_decoder": CaptureInputs(
        ids=_codebook_rows, why="a MusicGen-Melody decoder reads one row of ids per codebook, [B * num_codebooks, S]"
    ),
}
"""Extra capture inputs per ``model_type`` (see the module docstring)."""


def _fastspeech2_stack(runner: Any, hf: Any, tokens: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(0)
    if getattr(runner, "embed", None) is not None:  # the encoder embeds token ids
        return {"input_tensor": torch.randint(0, max(int(hf.vocab_size), 2), (1, tokens), generator=generator)}
    return {"input_tensor": torch.randn(1, tokens, int(hf.hidden_size), generator=generator)}


STACK_INPUTS: dict[str, Callable[[Any, Any, int], dict[str, Any]]] = {
    # FastSpeech2-Conformer's encoder and decoder take their input as `input_tensor`: the encoder token ids (its
    # `embed` table), the decoder the variance adaptor's hidden states [B, T, E] (seeded; it has no `embed`)
    "fastspeech2_conformer": _fastspeech2_stack,
}
"""Per ``model_type``, the main input of a stack's capture forward where the stack takes neither ``input_ids`` nor
features under their usual names: ``make(stack module, hf, tokens)`` -> keyword inputs
(:func:`posenc.trace.stacks.stack_inputs` asks here first)."""


def stack_capture_inputs(runner: Any, hf: Any, tokens: int) -> dict[str, Any] | None:
    """The :data:`STACK_INPUTS` entry's inputs of a ``hf`` model's stack ``runner`` on ``tokens`` tokens, or None."""
    make = STACK_INPUTS.get(str(getattr(hf, "model_type", "")))
    return make(runner, hf, tokens) if make is not None else None


ONE_STREAM: dict[str, str] = {
    "vilt": "ViLT's embeddings concatenate the text tokens (learned positions) and the image patches (learned "
    "positions interpolated to the image's grid) into one sequence",
    "tvp": "TVP's embeddings concatenate a learned 10-vector text prompt, the text tokens (learned positions) and "
    "the video frames' grid (learned row and column positions) into one sequence",
}
"""Models whose layers attend over text and another modality in one sequence. A unit that started at the text tokens
would not be what the model computes; the unit is the attention over the whole sequence, fed the embedded states as
the model hands them to the layer, and the manifest's part ``stack embeddings: absent`` says so with this
description (:func:`posenc.trace.stacks.outside_parts`). Their capture forward gets a zero image or video
(:data:`CAPTURE_INPUTS`)."""


UNREBUILT_CALLS: dict[str, str] = {}
"""Model types whose attention call posenc cannot rebuild from the unit's inputs, with what the call needs: refused
before the capture (:func:`capture_refusal`), as the argument-by-argument refusal would name only the first."""


def capture_refusal(hf: Any) -> str | None:
    """Why a ``hf`` model's attention cannot be captured on text (:data:`UNREBUILT_CALLS`), or None."""
    model_type = str(getattr(hf, "model_type", ""))
    unrebuilt = UNREBUILT_CALLS.get(model_type)
    if unrebuilt is not None:
        return f"{unrebuilt}, so the {model_type} model's attention cannot be traced yet."
    return None


ARGUMENT_MEANINGS: dict[str, str] = {
    "rel_pos": "a learned relative position bias the encoder computes once from the positions and hands every "
    "layer (LayoutLMv3's)",
    "rel_2d_pos": "a learned 2-D relative bias computed from the boxes (LayoutLMv3's)",
    "position_bias": "a relative position bias the stack computes before its layers and hands every layer "
    "(UDOP's encoder: T5's bucketed bias plus a 2-D bias from the boxes)",
    "layout_inputs": "the layout stream's states, a second input of every attention (LiLT): the first layer's are "
    "computed from the boxes (the unit's input bbox), a later layer's are what the layer before it returned",
    "bbox_pos_emb": "relative box embeddings [S, S, B, D] computed from the boxes (BROS)",
    "rotary_pos_emb": "rotation angles of positions 0 .. S - 1, which its model computes from the sequence length "
    "and not from position ids (CLVP's)",
    "extended_predict_attention_mask": "the masks of ProphetNet's n-gram predicting streams: its decoder attention "
    "(ProphetNetNgramSelfAttention) takes the main stream and its ngram predicting streams as one sequence "
    "[B, (1 + ngram) S, E] and attends them together, so a unit of one stream [B, S, E] is not what it computes",
    "prev_topk_indices": "the keys an earlier layer's lightning indexer selected, which this layer reuses (a shared "
    "DeepSeek sparse attention layer); posenc rebuilds them only where they are every key, i.e. the capture's "
    "tokens are at most the config's index_topk",
    "past_buckets_states": "Reformer's cache (ReformerDynamicCache) of LSH bucket ids and hidden states, not of keys "
    "and values: its local and LSH attentions recompute keys from the cached states, chunk by chunk",
}
"""What an attention argument posenc cannot rebuild is, by its name: the refusal says it
(:func:`posenc.trace.arguments.classify`). The unit's inputs are the hidden states, positions and cache; these are
computed from other inputs (boxes, an encoder) or by the model outside the layer."""


def argument_meaning(key: str) -> str:
    """``", <what it is>"`` for an argument named in :data:`ARGUMENT_MEANINGS`, else ``""``."""
    meaning = ARGUMENT_MEANINGS.get(key) or STREAMS.get(key)  # a second stream not [B, S, W] over the tokens
    return f", {meaning}" if meaning else ""


STREAMS: dict[str, str] = {
    "value_embeds": "value embeddings [B, S, Hkv * D] the model reads from a table of its own by the token ids and "
    "adds to the layer's values (NeoMME's first and last full-attention layers, as in modded-nanogpt)",
    "global_hidden_states": "the global tokens' states [B, G, E], a second stream beside the tokens' own that "
    "every layer's attention reads and returns updated (PEGASUS-X's global-local attention: a second input and "
    "output of the unit)",
    "encoder_hidden_states": "the encoder's states [B, S_enc, E], attended in the same softmax as the decoder's own "
    "tokens (merged self- and cross-attention: T5Gemma 2's decoder, whose keys and values of them the unit projects "
    "at every call)",
}
"""Attention arguments ``[B, S, W]`` the model computes from the token ids, not from positions, and hands the layer
beside its hidden states, by name -> what they are: a second stream of the layer. The unit takes each as a graph
input of that name after its other inputs (kind ``stream``; ``posenc validate`` feeds it like the hidden states, and
the model's module gets the same feed), so a deployment feeds it what the model computes (NeoMME: one table lookup
of the token ids, shared by the layers that read it). The graph's positional part is unchanged by it."""


STREAM_LENGTHS: dict[str, str] = {
    "encoder_hidden_states": "source",
    "global_hidden_states": "fixed",  # num_global_tokens
}
"""The length of a second stream (:data:`STREAMS`) that is not the tokens' ``seq``, by name: ``source``, a length of
its own (the graph's dynamic dimension ``source``; :func:`posenc.export.feeds.dim_size` sizes it in feeds): an
encoder's states, whatever the decoder's tokens and cache; ``fixed``, the capture's length, a constant of the model's
config. A stream not named here is ``[B, S, W]`` over the tokens."""


STREAM_OUTPUTS: dict[str, int] = {
    "global_hidden_states": 1,
}
"""Second streams the attention returns updated, by name -> the index of the updated stream in what its forward
returns (PEGASUS-X's ``(local_out, global_out, probs)``): the unit returns it as the graph output ``<name>_out``
after the others, and ``validate`` compares it as it compares ``out``."""


PADDED_BLOCKS: dict[str, str] = {
    "pegasus_x": "block_size",
}
"""Models whose stack pads the sequence to whole blocks before its layers, by ``model_type`` -> the config field of
the block: PEGASUS-X's encoder pads its hidden states with zeros to a multiple of ``block_size`` and its additive
padding mask ``[B, S]`` with the dtype's minimum there, and its local attention reads the sequence block by block
(``view(B, H, S // block, block, D)``). The capture runs on whole blocks (two of them), where the mask hides nothing
(kind ``padding``); the unit pads its input to whole blocks as the model does, hides the padding in that mask and
drops the padded rows of the output (:class:`posenc.trace.module.TracedAttention`). "Investigating Efficiently
Extending Transformers for Long Input Summarization" (Phang, Zhao and Liu, 2022, https://arxiv.org/abs/2208.04347)."""


def padded_block(hf: Any) -> int | None:
    """The block a ``hf`` model's stack pads its sequence to (:data:`PADDED_BLOCKS`), or None."""
    field = PADDED_BLOCKS.get(str(getattr(hf, "model_type", "")))
    value = getattr(hf, field, None) if field is not None else None
    return int(value) if isinstance(value, int) and value > 0 else None


EVERY_KEY: dict[str, str] = {
    "prev_topk_indices": "index_topk",
}
"""Arguments that are a top-k selection of key indices ``[B, S, K]`` another layer made, by name -> the config field
of its ``k``: HY-V4's and Mistral Large 4's shared DeepSeek-sparse-attention layers (``indexer_types`` 'shared') reuse
the indices the last full layer's lightning indexer kept (``topk(min(index_topk, K))`` of its index scores), and read
them only as a set (scattered into their mask). Over at most ``k`` keys that selection is every key, whatever the
scores, so the unit passes the indices ``0 .. K - 1`` to every query (kind ``every_key``,
:func:`posenc.trace.arguments.rebuild`) and the graph serves positions below ``k`` (guarded, as a full DSA layer's:
:func:`posenc.export.trace._selection_limit`). The capture checks that the model passed every key's index, and the
unit's call is checked against the model's own (same output) before export. DeepSeek sparse attention: "DeepSeek-V3.2:
Pushing the Frontier of Open Large Language Models" (DeepSeek-AI, 2025, https://arxiv.org/abs/2512.02556)."""


SEGMENTS: dict[str, str] = {
    "key_segment": "CPM-Ant's segment ids of the keys",
    "query_segment": "CPM-Ant's segment ids of the queries",
}
"""Arguments (by parameter name) that are a segment id per position, split at one position: CPM-Ant's forward prepends
``prompt_length`` prompt tokens (segment 0) to the text (segment 2 for every id but its padding id 0) and its
``CpmAntSegmentPositionEmbedding`` reads the segments beside the positions. For one call of text without padding the
segment is a function of the position, ``before`` below the split and ``after`` from it (kind ``segments``,
:func:`posenc.trace.arguments.segments_of`: measured on the capture and checked equal there, the split and ids
recorded); a capture with a padding id among the text is refused (its mask then hides that token: no mask the
unit rebuilds)."""


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
    "EVERY_KEY",
    "ONE_STREAM",
    "PADDED_BLOCKS",
    "SEGMENTS",
    "SOURCE_EXTRA",
    "STACK_INPUTS",
    "STREAMS",
    "STREAM_LENGTHS",
    "STREAM_OUTPUTS",
    "SUBSTITUTED",
    "UNREBUILT_CALLS",
    "CaptureInputs",
    "argument_meaning",
    "capture_inputs",
    "capture_refusal",
    "padded_block",
    "stack_capture_inputs",
]
