#!/usr/bin/env python3
"""Benchmark: one decode step's attention alone over a full in-place cache, formulated several ways, on ONNX Runtime
CPU against a copy of the cache's bytes timed in the same alternating rounds.

The attention ``decode_over_cache`` (``graphs/cache_decode.py``) runs in its grouped branch: a query of ``S`` tokens
``q [1, H, S, D]`` over every slot of ``K [1, Hkv, C, D]`` and ``V [1, Hkv, C, Dv]`` (``C = T``: a step at the cache's
last slot), a boolean mask of the ``C`` slots. Each formulation is a small ONNX graph; the floor is the bytes of ``K``
and ``V`` at the bandwidth of a 256 MiB copy (read + write, one thread, as ``posenc bench``'s), so ``floor ÷
latency`` is the attention's share of its bytes floor. Caches that fit the last-level cache (32 MiB here) stay there
between the timed calls: their ratios compare formulations, not memory.

    a   MatMul(q_g, Kᵀ), MatMul(P, V), q_g the G = H / Hkv heads of a kv head as G·S rows (posenc's grouped branch
        before this change);
        a1 with 1 intra-op thread, a-spin with spinning threads, a-basic at ORT_ENABLE_BASIC
    b   scores transposed, K·q_gᵀ [.., C, G·S], softmax over axis -2, MatMul(Pᵀ, V)
    c   b with contrib FusedMatMul written out (transB and alpha for the scores, transA for the values)
    d   contrib GroupQueryAttention over the shared buffer (the new token at the last slot; D = Dv only)
    e   a over 8 chunks of C (the chunks as a batch axis, one softmax, the partial values summed)
    h   every query head its own product (M = S), the cache broadcast over the group
    j   h over 64 chunks: the heads of a group read a chunk one after another
    k   K·q_gᵀ transposed back (small), then a's softmax and MatMul(P, V)   (posenc, G > 4; 2 <= G <= 4 at S > 1)
    m   k's scores, j's values                                               (posenc, float32, 2 <= G <= 4, S = 1)

    python scripts/bench_decode_attention.py [--geometries 4/2/512,16/1/192/128] [--slots 8192] [--queries 1]
        [--rounds 9] [--threads 2] [--cases a,k,m]

This is a benchmark, not a test: its numbers go into docs/performance.md, never into assertions. Every formulation's
output is checked against ``a``'s first (a difference above 1e-4 is printed).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

F = TensorProto.FLOAT
COPY_MIB = 256
"""The copy timed alongside: larger than the last-level cache, its bandwidth (read + write) gives the floor."""
Geometry = tuple[int, int, int, int, int, int]
"""H, Hkv, D, Dv, C, S."""


class Graph:
    """Nodes appended in order, int64 shape constants named on the fly."""

    def __init__(self, geometry: Geometry) -> None:
        self.h, self.hkv, self.d, self.dv, self.c, self.s = geometry
        self.g = self.h // self.hkv
        self.nodes: list[onnx.NodeProto] = []
        scale = helper.make_tensor("scale", F, [], [1 / np.sqrt(self.d)])
        self.op("Constant", [], "scale", value=scale)
        self.op("Constant", [], "ninf", value=helper.make_tensor("ninf", F, [], [-np.inf]))

    def op(self, op_type: str, inputs: list[str], output: str, domain: str = "", **attrs: object) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [output], domain=domain, **attrs))
        return output

    def ints(self, *values: int) -> str:
        name = f"c{len(self.nodes)}"
        return self.op("Constant", [], name, value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values))

    def reshape(self, x: str, out: str, *shape: int) -> str:
        return self.op("Reshape", [x, self.ints(*shape)], out)

    def transpose(self, x: str, out: str, *perm: int) -> str:
        return self.op("Transpose", [x], out, perm=list(perm))

    def grouped_q(self) -> str:
        """q scaled, [1, Hkv, G·S, D]."""
        return self.reshape(self.op("Mul", ["q", "scale"], "qs"), "gq", 0, self.hkv, -1, self.d)

    def softmax(self, scores: str) -> str:
        """Grouped scores [1, Hkv, G·S, C] -> probabilities [1, H, S, C]."""
        per_head = self.reshape(scores, "sch", 0, self.h, -1, self.c)
        return self.op("Softmax", [self.op("Where", ["mask", per_head, "ninf"], "scm")], "p", axis=-1)

    def grouped_values(self, probs: str) -> str:
        return self.op("MatMul", [self.reshape(probs, "pg", 0, self.hkv, -1, self.c), "v"], "og")

    def per_head_values(self, probs: str, chunks: int) -> str:
        """Each head's probabilities over ``chunks`` chunks times the chunk of V, summed: [1, Hkv, G·S, Dv]."""
        w = self.c // chunks
        by_chunk = self.reshape(probs, "pc", 0, self.hkv, self.g, self.s, chunks, w)
        values = self.reshape("v", "v6", 0, self.hkv, chunks, 1, w, self.dv)
        partial = self.op("MatMul", [self.transpose(by_chunk, "pct", 0, 1, 4, 2, 3, 5), values], "ov")
        return self.op("ReduceSum", [partial, self.ints(2)], "og", keepdims=0)

    def model(self, grouped_out: str) -> onnx.ModelProto:
        self.reshape(grouped_out, "out", 0, self.h, -1, self.dv)
        inputs = [
            helper.make_tensor_value_info("q", F, [1, self.h, self.s, self.d]),
            helper.make_tensor_value_info("k", F, [1, self.hkv, self.c, self.d]),
            helper.make_tensor_value_info("v", F, [1, self.hkv, self.c, self.dv]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 1, self.s, self.c]),
        ]
        output = helper.make_tensor_value_info("out", F, [None, None, None, None])
        graph = helper.make_graph(self.nodes, "attention", inputs, [output])
        opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
        return helper.make_model(graph, opset_imports=opsets)


def today(x: Graph, chunks: int = 1) -> onnx.ModelProto:
    q = x.grouped_q()
    if chunks == 1:
        return x.model(x.grouped_values(x.softmax(x.op("MatMul", [q, x.transpose("k", "kt", 0, 1, 3, 2)], "sc"))))
    w = x.c // chunks
    keys = x.transpose(x.reshape("k", "kc", 0, x.hkv, chunks, w, x.d), "kt", 0, 1, 2, 4, 3)
    scores = x.op("MatMul", [x.op("Unsqueeze", [q, x.ints(2)], "q5"), keys], "sc5")  # [1, Hkv, n, G·S, w]
    probs = x.softmax(x.reshape(x.transpose(scores, "sct", 0, 1, 3, 2, 4), "sc", 0, x.hkv, -1, x.c))
    by_chunk = x.transpose(x.reshape(probs, "pc", 0, x.hkv, -1, chunks, w), "pct", 0, 1, 3, 2, 4)
    partial = x.op("MatMul", [by_chunk, x.reshape("v", "vc", 0, x.hkv, chunks, w, x.dv)], "ov")
    return x.model(x.op("ReduceSum", [partial, x.ints(2)], "og", keepdims=0))


def transposed(x: Graph, fused: bool = False) -> onnx.ModelProto:
    if fused:
        q = x.reshape("q", "gq", 0, x.hkv, -1, x.d)
        scores = x.op("FusedMatMul", ["k", q], "sc", domain="com.microsoft", transB=1, alpha=1 / np.sqrt(x.d))
    else:
        scores = x.op("MatMul", ["k", x.transpose(x.grouped_q(), "gqt", 0, 1, 3, 2)], "sc")  # [1, Hkv, C, G·S]
    mask = x.reshape(x.transpose("mask", "mt", 0, 1, 3, 2), "m5", 1, 1, x.c, 1, x.s)
    scores = x.op("Where", [mask, x.reshape(scores, "sc5", 0, x.hkv, x.c, x.g, x.s), "ninf"], "scm5")
    probs = x.op("Softmax", [x.reshape(scores, "scm", 0, x.hkv, x.c, x.g * x.s)], "p", axis=-2)
    if fused:
        return x.model(x.op("FusedMatMul", [probs, "v"], "og", domain="com.microsoft", transA=1))
    return x.model(x.op("MatMul", [x.transpose(probs, "pt", 0, 1, 3, 2), "v"], "og"))


def group_query_attention(x: Graph) -> onnx.ModelProto:
    q = x.reshape(x.transpose("q", "qt", 0, 2, 1, 3), "q3", 0, x.s, x.h * x.d)
    new = {}
    for cache in ("k", "v"):  # the new entries: the last S slots, as the op's [B, S, Hkv·D] inputs
        last = x.op("Slice", [cache, x.ints(0, 0, x.c - x.s, 0), x.ints(1, x.hkv, x.c, x.d)], f"{cache}n")
        new[cache] = x.reshape(x.transpose(last, f"{cache}nt", 0, 2, 1, 3), f"{cache}3", 0, x.s, x.hkv * x.d)
    lengths = helper.make_tensor("seqlens", TensorProto.INT32, [1], [x.c - 1])
    x.op("Constant", [], "seqlens", value=lengths)
    x.op("Constant", [], "total", value=helper.make_tensor("total", TensorProto.INT32, [], [x.c]))
    inputs = [q, new["k"], new["v"], "k", "v", "seqlens", "total"]
    attrs = {"num_heads": x.h, "kv_num_heads": x.hkv}
    outputs = ["o3", "pk", "pv"]
    x.nodes.append(helper.make_node("GroupQueryAttention", inputs, outputs, domain="com.microsoft", **attrs))
    out = x.transpose(x.reshape("o3", "o4", 0, x.s, x.h, x.d), "o4t", 0, 2, 1, 3)
    return x.model(x.reshape(out, "og", 0, x.hkv, -1, x.d))


def per_head(x: Graph, chunks: int = 1) -> onnx.ModelProto:
    w = x.c // chunks
    q = x.reshape(x.op("Mul", ["q", "scale"], "qs"), "gq", 0, x.hkv, 1, x.g, x.s, x.d)
    keys = x.transpose(x.reshape("k", "k6", 0, x.hkv, chunks, 1, w, x.d), "kt", 0, 1, 2, 3, 5, 4)
    scores = x.op("MatMul", [q, keys], "sc")  # [1, Hkv, n, G, S, w]
    probs = x.softmax(x.reshape(x.transpose(scores, "sct", 0, 1, 3, 4, 2, 5), "scg", 0, x.hkv, -1, x.c))
    return x.model(x.per_head_values(probs, chunks))


def scores_k_first(x: Graph) -> str:
    scores = x.op("MatMul", ["k", x.transpose(x.grouped_q(), "gqt", 0, 1, 3, 2)], "sct")
    return x.softmax(x.transpose(scores, "sc", 0, 1, 3, 2))


FORMULATIONS: dict[str, tuple[Callable[[Graph], onnx.ModelProto], dict[str, object]]] = {
    "a": (today, {}),
    "a1": (today, {"threads": 1}),
    "a-spin": (today, {"spinning": True}),
    "a-basic": (today, {"level": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}),
    "b": (transposed, {}),
    "c": (lambda x: transposed(x, fused=True), {}),
    "d": (group_query_attention, {}),
    "e": (lambda x: today(x, chunks=8), {}),
    "h": (per_head, {}),
    "j": (lambda x: per_head(x, chunks=64), {}),
    "k": (lambda x: x.model(x.grouped_values(scores_k_first(x))), {}),
    "m": (lambda x: x.model(x.per_head_values(scores_k_first(x), 64)), {}),
}


def session(model: onnx.ModelProto, threads: int, spinning: bool = False, level=None) -> ort.InferenceSession:
    """Sessions do not spin by default (posenc's benchmark sessions: docs/performance.md)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = level or ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


SOURCE = np.ones(COPY_MIB << 18, dtype=np.float32)
TARGET = np.empty_like(SOURCE)


def measure(geometry: Geometry, cases: list[str], rounds: int, threads: int) -> None:
    h, hkv, d, dv, c, s = geometry
    rng = np.random.default_rng(0)
    feed = {
        "q": rng.standard_normal((1, h, s, d), dtype=np.float32),
        "k": rng.standard_normal((1, hkv, c, d), dtype=np.float32),
        "v": rng.standard_normal((1, hkv, c, dv), dtype=np.float32),
        "mask": np.ones((1, 1, s, c), dtype=bool),
    }
    sessions = {}
    for name in cases:
        build, options = FORMULATIONS[name]
        if name == "d" and (d != dv or s != 1):
            continue
        sessions[name] = session(build(Graph(geometry)), **{"threads": threads, **options})  # type: ignore[arg-type]
    reference = next(iter(sessions.values())).run(None, feed)[0]
    for name, sess in sessions.items():
        error = float(np.abs(sess.run(None, feed)[0] - reference).max())
        if error > 1e-4:
            print(f"  {name}: max |difference| from {next(iter(sessions))} {error:.2e}")
    nbytes = feed["k"].nbytes + feed["v"].nbytes
    calls = {"copy": lambda: np.copyto(TARGET, SOURCE)}
    calls.update({name: (lambda x=x: x.run(None, feed)) for name, x in sessions.items()})
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):  # each round: one untimed call per case (its threads wake up), then 3 timed ones
        for name, call in calls.items():
            call()
            for _ in range(3):
                begin = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - begin)
    bandwidth = 2 * SOURCE.nbytes / float(np.median(samples.pop("copy")))
    copy = nbytes / bandwidth
    print(
        f"H/Hkv/D/Dv {h}/{hkv}/{d}/{dv}, C = T = {c}, S = {s}: K + V {nbytes / 1e6:.1f} MB, copy "
        f"{bandwidth / 1e9:.1f} GB/s: floor {copy * 1e6:.0f} µs"
    )
    for name, times in samples.items():
        median = float(np.median(times))
        print(f"  {name:8s} {median * 1e6:8.0f} µs   floor ÷ latency {copy / median:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--geometries", default="4/2/512,16/1/192/128,4/2/256,8/2/128", help="H/Hkv/D[/Dv],...")
    parser.add_argument("--slots", type=int, default=8192)
    parser.add_argument("--queries", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cases", default=",".join(FORMULATIONS))
    args = parser.parse_args()
    ort.set_default_logger_severity(3)
    for text in args.geometries.split(","):
        parts = [int(x) for x in text.split("/")]
        geometry = (*parts[:3], parts[3] if len(parts) > 3 else parts[2], args.slots, args.queries)
        measure(geometry, args.cases.split(","), args.rounds, args.threads)  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
