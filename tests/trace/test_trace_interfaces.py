"""The traced unit's interface where this round's branches meet: cache inputs, streams, boxes and padding.

Each test holds one rule the merge of several features relies on (a review of the merged code found these paths):
a position-ids entry of a dict argument, a padding mask outside the attention's own call, a ring's kept rows beside a
fixed-size state, the unit's cache inputs against its forward, the decode runner's refusal of a cacheless graph, and
the manifest part of Longformer's window padding.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from posenc.errors import ConfigError, ExportError


def test_a_dict_arguments_position_ids_entry_and_a_padding_mask_rebuild_outside_the_call() -> None:
    """``rebuild`` of ``position_ids`` whose key holds a dict argument's constants gives the positions (the dtype
    entry is CPM-Ant's string only); ``padding`` outside the attention's own call is an all-visible additive mask."""
    from posenc.trace.arguments import rebuild

    hidden, positions = torch.zeros(2, 5, 4), torch.arange(5).expand(2, 5)
    entries = {"mask": {"positions": ["position_ids", None]}}
    assert torch.equal(rebuild("mask", "position_ids", entries, hidden, positions, 0), positions)
    assert rebuild("ids", "position_ids", {"ids": "int32"}, hidden, positions, 0).dtype == torch.int32
    padding = rebuild("attention_mask", "padding", {"attention_mask": ["float32", None]}, hidden, positions, 0)
    assert padding.shape == (2, 5)
    assert padding.dtype == torch.float32
    assert not padding.any()


def test_a_rings_kept_rows_cut_the_key_and_value_caches_only() -> None:
    """``keep_last`` cuts the token axis of ``present_key`` / ``present_value``; a fixed-size state keeps its shape."""
    from posenc.validate.steps import keep_last

    outputs = {
        "out": np.zeros((1, 3, 8)),
        "present_key": np.arange(10.0).reshape(1, 1, 10, 1),
        "present_value": np.zeros((1, 1, 10, 2)),
        "present_conv_state_0": np.zeros((1, 6, 12)),
    }
    kept = keep_last(outputs, 4)
    assert kept["present_key"].ravel().tolist() == [6.0, 7.0, 8.0, 9.0]
    assert kept["present_value"].shape == (1, 1, 4, 2)
    assert kept["present_conv_state_0"].shape == (1, 6, 12)
    assert kept["out"].shape == (1, 3, 8)


def _slots(*names: str, kind: str = "past") -> list:
    from posenc.export.feeds import Slot

    return [Slot(name, kind, ("batch",), "") for name in names]


def test_the_units_cache_inputs_are_its_forwards_and_at_most_eight_inputs() -> None:
    """The graph's cache inputs must be the unit's (:attr:`TracedAttention.cache_inputs`, in order), and a unit
    names eight inputs: more, or another order, is refused before torch.export binds them wrongly."""
    from posenc.export.trace_unit import check_inputs

    unit = SimpleNamespace(cache_inputs=["past_key", "past_value", "past_conv_state_0"])
    acts = _slots("hidden", "position_ids", kind="act")
    check_inputs(unit, [*acts, *_slots("past_key", "past_value", "past_conv_state_0")])
    with pytest.raises(ExportError, match="past_indexer_key"):
        check_inputs(unit, [*acts, *_slots("past_key", "past_value", "past_indexer_key")])
    with pytest.raises(ExportError, match="9 inputs"):
        check_inputs(unit, [*acts, *_slots("past_key", "past_value"), *_slots(*"abcde", kind="act")])


def test_decode_steps_refuse_a_graph_without_a_cache() -> None:
    """A cacheless traced graph (an encoder's attention) has no decode step: the runner says so at once."""
    from posenc.validate.decode import OrtDecodeRunner

    manifest = SimpleNamespace(unit="block", input_names=["hidden", "position_ids", "bbox"], output_names=["out"])
    with pytest.raises(ConfigError, match="takes no cache"):
        OrtDecodeRunner(b"", manifest, 1, "graph")


def test_longformers_window_padding_is_a_manifest_part() -> None:
    """A unit padding its input to the attention window (Longformer, LED's encoder) says so in the manifest, as a
    unit padding to PEGASUS-X's blocks does; a unit that pads nothing has no such part."""
    from posenc.export.trace import PADDING_PART, _padding_parts
    from posenc.trace.record import CallRecipe
    from posenc.trace.windows import WINDOW_ATTRIBUTE

    attention = nn.Module()
    setattr(attention, WINDOW_ATTRIBUTE, 4)
    call = CallRecipe(("hidden",), {"attention_mask": "padding"}, {"attention_mask": ["float32", None]})
    plan = SimpleNamespace(captured=SimpleNamespace(call=call, attention=attention, cacheless=True))
    (part,) = _padding_parts(plan)
    assert part.part == PADDING_PART
    assert "attention window (8)" in part.detail
    plain = SimpleNamespace(captured=SimpleNamespace(call=call, attention=nn.Module(), cacheless=True))
    assert _padding_parts(plain) == ()
