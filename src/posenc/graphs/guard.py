"""The position guard on ONNX Runtime CPU: carried by ``RotaryEmbedding``'s own range check where it can be.

An exported graph guards its positions (:func:`posenc.functional.position_guard`)::

    valid  = And(GreaterOrEqual(p, 0), Less(p, L))
    safe   = Where(valid, p, 0)                        # every table read stays in bounds
    poison = Where(valid, tripwire[Where(valid, 0, 1)], NaN)   # ONNX Runtime raises, TensorRT gets NaN
    hidden = Add(hidden, Unsqueeze(poison))

At a decode step those ten nodes cost about 5 % of a fused RoPE block on ONNX Runtime CPU, where each node has a
fixed overhead. ONNX Runtime's CPU ``RotaryEmbedding`` kernel refuses every position outside ``[0, rows of its
cos cache)`` itself ("position_ids value ... is out of range"), so when the safe ids only reach such rotations
over tables of exactly ``L`` rows (and comparisons, never another table read), the guard adds nothing there:
:func:`guard_in_rotary` lets the rotations read the raw ids and drops the poison, and a bad position still raises.

Only for ``--target ort-cpu``: other runtimes' kernels (CUDA, TensorRT) do not promise that check, so their graphs
keep the guard.
"""

from __future__ import annotations

import onnx_ir as ir

from posenc.graphs import match_utils as mu

_INDEX_INPUTS = {"Gather": 1, "GatherElements": 1, "GatherND": 1, "ScatterElements": 1, "ScatterND": 1,
                 "TensorScatter": 2}  # fmt: skip
"""Ops that read or write memory at an index, and which input is the index (positions there would be a table read;
as data they are only moved)."""


def _guard_of(safe_node: ir.Node) -> tuple[ir.Value, int, ir.Value] | None:
    """``(position ids, L, valid)`` when ``safe_node`` is the guard's ``Where(valid, p, 0)``, else None."""
    if safe_node.op_type != "Where" or safe_node.domain not in ("", "ai.onnx") or len(safe_node.inputs) != 3:
        return None
    valid, ids, zero = safe_node.inputs
    if valid is None or ids is None or mu.const_ints(zero) != [0]:
        return None
    both = mu.producer_of(valid, "And")
    if both is None:
        return None
    low, high = (v.producer() if v is not None else None for v in both.inputs)
    if low is None or high is None or low.op_type != "GreaterOrEqual" or high.op_type != "Less":
        return None
    if low.inputs[0] is not ids or high.inputs[0] is not ids or mu.const_ints(low.inputs[1]) != [0]:
        return None
    limit = mu.const_ints(high.inputs[1])
    if limit is None or len(limit) != 1:
        return None
    return ids, limit[0], valid


def _only_checked_rotations(safe: ir.Value, limit: int) -> bool:
    """Every path from ``safe`` ends in a ``RotaryEmbedding`` position input over a ``limit``-row cos cache, or in
    comparisons and shape work (masks), never in another op that indexes memory with it."""
    seen: set[int] = set()
    frontier = [safe]
    while frontier:
        value = frontier.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        for node, index in value.uses():
            if node.op_type == "RotaryEmbedding" and node.domain in ("", "ai.onnx"):
                if index != 3 or mu.static_dim(node.inputs[1], 0) != limit:
                    return False
                continue  # the rotated values carry no position onwards
            if _INDEX_INPUTS.get(node.op_type) == index or node.op_type in ("If", "Loop", "Scan"):
                return False
            frontier.extend(node.outputs)
    return True


def _poison_adds(valid: ir.Value) -> list[ir.Node] | None:
    """The ``Add(x, poison)`` nodes (through one optional ``Unsqueeze``) fed by the guard's poison of ``valid``;
    None when the poison goes anywhere else (e.g. summed with a key guard's)."""
    poisons = [
        node
        for node, _ in valid.uses()
        if node.op_type == "Where" and mu.is_nan(node.inputs[2] if node.inputs else None)
    ]
    if len(poisons) != 1:
        return None
    adds = []
    for node, index in poisons[0].outputs[0].uses():
        if node.op_type == "Unsqueeze":
            users = list(node.outputs[0].uses())
            if not all(user.op_type == "Add" and i == 1 for user, i in users):
                return None
            adds += [user for user, _ in users]
        elif node.op_type == "Add" and index == 1:
            adds.append(node)
        else:
            return None
    return adds


def _can_bypass(add: ir.Node) -> bool:
    """Whether ``Add(x, poison)`` can hand its consumers (or its graph output name) to ``x``."""
    x, out = add.inputs[0], add.outputs[0]
    if x is None:
        return False
    if not out.is_graph_output():
        return True
    # the graph output keeps its name on x: x must be a plain intermediate value
    return not (x.is_graph_input() or x.is_graph_output() or x.is_initializer() or x.producer() is None)


def _bypass(graph: ir.Graph, add: ir.Node) -> None:
    """``Add(x, poison)`` -> ``x`` for its consumers; a graph output moves to ``x`` under the same name."""
    x, out = add.inputs[0], add.outputs[0]
    assert x is not None  # _can_bypass
    if out.is_graph_output():
        index = list(graph.outputs).index(out)
        name, out.name = out.name, None
        graph.outputs[index] = x
        x.name = name
    ir.convenience.replace_all_uses_with(out, x)
    owner = add.graph
    if owner is not None:
        owner.remove(add, safe=True)  # nothing reads it now (its output kept no name, so shapes need not see it)


def guard_in_rotary(model: ir.Model) -> int:
    """Let ONNX Runtime CPU's ``RotaryEmbedding`` range check carry each position guard it can (module docstring):
    the rotations read the raw ids and the poison's ``Add`` passes its input through; the guard's other nodes are
    left for cleanup. Returns the number of guards handed over."""
    handed = 0
    for node in list(model.graph.all_nodes()):
        found = _guard_of(node)
        if found is None:
            continue
        ids, limit, valid = found
        safe = node.outputs[0]
        adds = _poison_adds(valid)
        checked = any(user.op_type == "RotaryEmbedding" and index == 3 for user, index in safe.uses())
        if adds is None or not checked or safe.is_graph_output() or not _only_checked_rotations(safe, limit):
            continue  # no whole-tensor range check, or the positions or poison go somewhere it does not cover
        if not all(_can_bypass(add) for add in adds):
            continue
        for add in adds:
            _bypass(model.graph, add)
        ir.convenience.replace_all_uses_with(safe, ids)
        handed += 1
    return handed


__all__ = ["guard_in_rotary"]
