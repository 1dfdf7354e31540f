"""The traced path: a checkpoint's own attention layer exported as its model calls it, with posenc's tables.

References: a Llama checkpoint's family export (posenc's rebuild, proven against transformers elsewhere), the
checkpoint's own transformers modules (native float32 angles, and float64 angles from posenc's scheme), and the
traced graph before posenc's rewrite (whose float32 angles must be the ones that drift).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from posenc.checkpoints import load_layer
from posenc.cli import main
from posenc.errors import ConfigError, ExportError
from posenc.export import export_onnx, load_manifest
from posenc.export.feeds import make_feed
from posenc.export.runtime import ort_session
from posenc.export.shapes import FeedShape
from posenc.export.trace import RewriteRequest, export_traced
from posenc.graphs.inspect import inspect_model
from posenc.graphs.optimize import optimize_file
from posenc.graphs.trace_rewrite import replace_positions
from posenc.trace.reference import load_traced
from posenc.validate import check_ort_parity, validate_onnx
from posenc.validate.checkpoint import validate_against_checkpoint
from posenc.validate.decode import decode_schedule, serving_limit, validate_decode
from tests.trace.samples import SAMPLES, build

FUSED = ("RotaryEmbedding", "Attention", "GroupQueryAttention", "If")


@dataclasses.dataclass
class Exported:
    folder: Path
    traced: object
    family: object
    request: RewriteRequest


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trace")


@pytest.fixture(scope="module")
def llama(root: Path) -> Exported:
    """The Llama sample exported both ways; the rewrite's request (the traced graph before it) kept."""
    folder = build(SAMPLES["llama"], root)
    requests: list[RewriteRequest] = []

    def spy(request: RewriteRequest):
        requests.append(request)
        return replace_positions(request)

    traced = export_traced(root / "llama_trace.onnx", folder, rewrite=spy)
    loaded = load_layer(folder)
    family = export_onnx(loaded.block(), root / "llama_family.onnx", provenance=loaded.provenance())
    return Exported(folder, traced, family, requests[0])


def _run(model: str | Path | bytes, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort_session(model).run(None, feed)


def _fused(path: Path) -> dict[str, int]:
    """The fused ops of a graph, inside If branches too."""
    ops = inspect_model(path).ops
    return {op.split("::")[-1]: n for op, n in ops.items() if op.split("::")[-1] in FUSED}


def test_a_traced_llama_layer_computes_what_its_family_export_computes(llama: Exported) -> None:
    manifest = llama.traced.manifest
    assert manifest.trace is not None
    assert manifest.weights.source.family == "trace"
    assert [(p.part, p.status) for p in manifest.trace.parts] == [
        ("rotary angles", "replaced"),
        ("rotation", "replaced"),
        ("attention mask", "replaced"),
    ]
    assert manifest.inputs == llama.family.manifest.inputs
    assert manifest.outputs == llama.family.manifest.outputs
    for shape in (FeedShape(2, 5, 3), FeedShape(1, 1, 9), FeedShape(1, 4, 0, start=32764)):
        feed = make_feed(manifest, shape, seed=3)
        traced = _run(llama.traced.path, feed)
        family = _run(llama.family.path, feed)
        for a, b in zip(traced, family, strict=True):
            assert np.abs(a - b).max() <= 2e-6, shape


def test_the_traced_graph_optimizes_into_the_family_graph(llama: Exported, tmp_path: Path) -> None:
    """On ort-cpu both graphs fuse into the same ops: RotaryEmbedding x2, GroupQueryAttention in an If (prefill),
    Attention (the rest); the traced graph's node count is within a few nodes of the family's."""
    paths = {}
    for name, result in (("traced", llama.traced), ("family", llama.family)):
        out = optimize_file(result.path, tmp_path / f"{name}.onnx", "ort-cpu", check=check_ort_parity)
        paths[name] = out.path
    traced, family = (_fused(paths[n]) for n in ("traced", "family"))
    assert traced == family == {"RotaryEmbedding": 2, "Attention": 1, "GroupQueryAttention": 1, "If": 1}
    sizes = [inspect_model(paths[n]).nodes for n in ("traced", "family")]
    assert abs(sizes[0] - sizes[1]) <= 3, sizes
    assert validate_onnx(paths["traced"], shapes=[FeedShape(2, 5, 3), FeedShape(1, 7, 0)]).passed


def test_the_graph_s_angles_are_posenc_s_where_the_traced_ones_drift(llama: Exported) -> None:
    """Near the context length the rewritten graph is within 1e-5 of the module fed float64 angles; the traced graph
    before the rewrite (transformers' float32 angles) is an order of magnitude further off there."""
    manifest = llama.traced.manifest
    feed = make_feed(manifest, FeedShape(1, 4, 0, start=32764), seed=5)
    exact = load_traced(llama.folder).reference("float64", torch.float64)
    want = [t.numpy() for t in exact(*(torch.from_numpy(feed[k]) for k in ("hidden", "position_ids", "past_key",
                                                                            "past_value")))]  # fmt: skip
    rewritten = _run(llama.traced.path, feed)
    traced = _run(llama.request.model.SerializeToString(), feed)
    rewritten_error = max(float(np.abs(a - b).max()) for a, b in zip(rewritten, want, strict=True))
    traced_error = max(float(np.abs(a - b).max()) for a, b in zip(traced, want, strict=True))
    assert rewritten_error <= 1e-5
    assert traced_error > 10 * rewritten_error
    assert traced_error > 1e-5


def test_angles_that_are_not_posenc_s_stay_as_traced(llama: Exported) -> None:
    """The graph's cos/sin are compared with posenc's scheme on probe positions: a scheme with another base does not
    match, so the traced angles stay (and the manifest part says what differed)."""
    request = llama.request
    wrong = dataclasses.replace(request.plan, params={**request.plan.params, "rope_theta": 20000.0})
    model, parts = replace_positions(dataclasses.replace(request, plan=wrong, exact=wrong.exact_scheme()))
    assert (parts[0].part, parts[0].status) == ("rotary angles", "kept")
    assert "is not 'rope''s cos or sin in any layout" in parts[0].detail
    ops = [node.op_type for node in model.graph.node]
    assert {"Cos", "Sin"} <= set(ops)
    assert not any(init.name.startswith("posenc_angles/") for init in model.graph.initializer)


def test_a_trace_whose_angles_are_not_recognised_exports_as_traced(
    llama: Exported, root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import posenc.export.trace as trace_export

    planned = trace_export.plan_trace

    def unrecognised(captured):
        plan = planned(captured)
        return dataclasses.replace(plan, angles=None, note="the rotary module's cos/sin are not posenc's (test)")

    monkeypatch.setattr(trace_export, "plan_trace", unrecognised)
    result = export_traced(root / "kept.onnx", llama.folder, rewrite=replace_positions)
    parts = {p.part: p for p in result.manifest.trace.parts}
    assert parts["rotary angles"].status == "kept"
    assert "(test)" in parts["rotary angles"].detail
    assert result.manifest.table_mode == "dynamic"
    assert result.manifest.weights.tables == ()
    ops = [node.op_type for node in onnx.load(str(result.path)).graph.node]
    assert {"Cos", "Sin"} <= set(ops)
    report = inspect_model(result.path)
    assert "kept: rotary angles (the rotary module's cos/sin are not posenc's (test))" in report.to_text()
    assert main(["inspect", str(result.path)]) == 0
    assert "traced: llama layer 0" in capsys.readouterr().out
    assert validate_onnx(result.path, shapes=[FeedShape(2, 3, 2)]).passed  # its reference keeps the model's angles


def test_decode_steps_with_a_cache_on_a_traced_graph(root: Path, tmp_path: Path) -> None:
    """GPT-OSS (YaRN, learned sinks, a 4-key sliding window): a prefill and single-token steps past the window, then a
    jump to the last position, each step held to the float64 module carrying its own cache; exported and optimized."""
    folder = build(SAMPLES["gpt_oss"], root)
    result = export_traced(root / "gpt_oss.onnx", folder, rewrite=replace_positions)
    optimized = optimize_file(result.path, tmp_path / "gpt_oss_cpu.onnx", "ort-cpu", check=check_ort_parity)
    schedule = decode_schedule(serving_limit(result.manifest), steps=8)
    report = validate_decode([result.path, optimized.path], schedule)
    assert report.passed, report.to_markdown()
    assert len({row.feed for row in report.rows}) == len(schedule)


def test_positions_that_enter_at_the_embeddings_trace_with_the_embedding_step(root: Path, tmp_path: Path) -> None:
    """GPT-2: the unit is ``ln_1(tokens + wpe(position_ids))`` and layer 0's attention; the learned table stays the
    model's own (kept, said), the graph matches the checkpoint's modules and carries a cache through decode steps."""
    folder = build(SAMPLES["gpt2"], root)
    result = export_traced(root / "gpt2.onnx", folder, rewrite=replace_positions)
    record = result.manifest.trace
    assert record is not None
    assert record.embedding is not None
    assert [ref.path for ref in (record.embedding.position, *record.embedding.norms)] == ["wpe", "h.0.ln_1"]
    assert (result.manifest.scheme, result.manifest.max_positions) == ("learned", 1024)
    assert "kept: position table (Gather of the model's table" in inspect_model(result.path).to_text()
    assert validate_against_checkpoint(result.path, folder, shapes=[FeedShape(2, 5, 3), FeedShape(1, 1, 7)]).passed
    assert validate_decode([result.path], decode_schedule(serving_limit(result.manifest), steps=4)).passed


def test_a_layer_without_attention_is_refused_with_the_layers_that_have_it(root: Path) -> None:
    folder = build(SAMPLES["qwen3_next"], root)
    with pytest.raises(ConfigError, match=r"layer 0 of this qwen3_next model has no softmax attention.*"
                                          r"Qwen3NextGatedDeltaNet.*layers with attention: \[3\]"):  # fmt: skip
        export_traced(root / "none.onnx", folder, layer=0)
    assert not (root / "none.onnx").exists()


def test_an_argument_posenc_cannot_rebuild_is_named(llama: Exported, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.models.llama import modeling_llama

    forward = modeling_llama.LlamaDecoderLayer.forward

    def with_extra(self, hidden_states, **kwargs):
        return forward(self, hidden_states, token_scale=torch.ones(hidden_states.shape[1]), **kwargs)

    monkeypatch.setattr(modeling_llama.LlamaDecoderLayer, "forward", with_extra)
    with pytest.raises(ExportError, match=r"argument 'token_scale' \(\[8\]\), which posenc cannot rebuild"):
        export_traced(llama.folder / "x.onnx", llama.folder)


def test_a_module_torch_export_cannot_trace_is_refused(llama: Exported, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.models.llama import modeling_llama

    forward = modeling_llama.LlamaAttention.forward

    def branching(self, hidden_states, *args, **kwargs):
        if float(hidden_states.sum()) > 1e9:  # data-dependent Python control flow
            hidden_states = hidden_states * 2
        return forward(self, hidden_states, *args, **kwargs)

    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", branching)
    with pytest.raises(ExportError, match=r"torch\.export could not trace"):
        export_traced(llama.folder / "x.onnx", llama.folder)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dtype": "fp16"}, "float32 graphs only"),
        ({"kv_cache": "inplace"}, "concatenated cache only"),
        ({"opset": 18}, "opset 23 graphs"),
    ],
)
def test_options_the_traced_path_lacks_are_refused(llama: Exported, options: dict, message: str) -> None:
    with pytest.raises(ExportError, match=re.escape(message)):
        export_traced(llama.folder / "x.onnx", llama.folder, **options)


def test_the_cli_traces_on_request_and_by_default_without_a_family(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = build(SAMPLES["phi"], root)
    out = root / "phi.onnx"
    assert main(["export", "--hf-model", str(folder), "--via", "trace", "-o", str(out)]) == 0  # phi has a family too
    printed = capsys.readouterr().out
    assert "note: positional part replaced: rotary angles" in printed
    assert main(["validate", str(out), "--against-hf", str(folder)]) == 0
    gpt2 = build(SAMPLES["gpt2"], root)  # no family: the default is the trace
    assert main(["export", "--hf-model", str(gpt2), "-o", str(root / "gpt2.onnx")]) == 0
    assert load_manifest(root / "gpt2.onnx").trace is not None
    capsys.readouterr()
    assert main(["export", "--hf-model", str(gpt2), "--via", "family", "-o", str(root / "x.onnx")]) == 2
    assert "--via trace" in capsys.readouterr().err
