"""`posenc demo --quick` end to end: the report names every scheme, every verdict the machine can give is PASS, the
real checkpoints match their own transformers modules, and the report is self-contained.

The demo runs once per test; one test checks the whole report, so pytest-xdist never runs the demo twice. ``make
test`` runs it for RoPE and a dynamic-only scheme (:data:`DEFAULT_RUN`); every scheme's run is ``slow``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from posenc.cli import main
from posenc.demo.checkpoints import QUICK_SAMPLES
from posenc.demo.records import DemoResult
from posenc.engine import available_backends
from posenc.schemes import get_spec, scheme_names

DEFAULT_RUN = ("rope", "rope_dynamic")
"""The schemes whose demo output differs from any other's: RoPE (the op-3d bench case, the decode step with both
cache layouts, the sweep and decay plots) and a scheme with only dynamic tables (``n/a`` precomputed columns). The
demo runs every other scheme through the same stages, each tested for every scheme on its own: export parity
(tests/validate/test_parity_matrix.py), the demo's optimize-and-validate stage
(tests/graphs/test_every_block_optimizes.py), engine builds (tests/engine/test_matrix.py); the bench harness is
scheme-agnostic (tests/bench/). The ``every-scheme`` run (slow) holds every scheme to the report."""


def _section(markdown: str, title: str) -> str:
    start = markdown.index(f"## {title}")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end > 0 else None]


def _table_rows(section: str) -> dict[str, list[str]]:
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| scheme"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows.setdefault(cells[0], cells)
    return rows


def _check_parity(out: Path, markdown: str, schemes: set[str]) -> None:
    matrix = _table_rows(_section(markdown, "Parity matrix"))
    assert set(matrix) == schemes
    for scheme, cells in matrix.items():
        supported = {m.value for m in get_spec(scheme).table_modes}
        verdicts = [c for c in cells[1:] if c not in ("n/a", "not run")]  # --quick runs one table mode
        assert verdicts, f"{scheme} has no parity verdict: {cells}"
        assert all(c.startswith("PASS ") for c in verdicts), f"{scheme}: every graph the demo ran must PASS: {cells}"
        # columns: precomputed (exported, optimized), dynamic (exported, optimized)
        for mode, pair in (("precomputed", cells[1:3]), ("dynamic", cells[3:5])):
            if mode not in supported:
                assert pair == ["n/a", "n/a"], (scheme, pair)
        for cell in verdicts:  # a verdict carries the largest error as a number
            assert re.search(r"\d\.\de[-+]\d\d", cell), cell
    results = DemoResult.load(out / "demo.json")  # strict: every key of demo.json is a field of a record
    assert results.to_dict() == json.loads((out / "demo.json").read_text())
    assert {r.scheme for r in results.pipeline} == schemes
    for record in results.pipeline:
        assert set(record.parity) == {"exported", "ort-cpu"}, record.scheme
        for graph, stage in record.parity.items():
            assert stage.status == "ok", (record.scheme, graph, stage)
            assert stage.passed, (record.scheme, graph, stage)
            assert (out / "parity" / stage.details).read_text().startswith("### Parity")


def _check_checkpoints(out: Path, markdown: str) -> None:
    """Every quick sample: built, exported, validated (exported and optimized) against its module, engine built."""
    section = _section(markdown, "Real checkpoints")
    rows = _table_rows(section.replace("| checkpoint |", "| scheme |"))
    assert set(rows) == set(QUICK_SAMPLES)
    results = DemoResult.load(out / "demo.json")
    assert [r.sample for r in results.checkpoints] == list(QUICK_SAMPLES)
    for record in results.checkpoints:
        assert record.passed, record
        assert {(p.graph, p.table_mode) for p in record.parity} == {
            ("exported", "precomputed"),
            ("ort-cpu", "precomputed"),
        }
        for stage in record.parity:
            assert stage.worst["hf-fp32"] <= 1e-5, (record.sample, stage.worst)
            assert stage.worst["hf-fp64, fp64 angles"] <= 1e-5, (record.sample, stage.worst)
            table = (out / "parity" / stage.details).read_text()
            assert "| hf-fp32 |" in table
            assert "transformers" in table
        if available_backends():
            assert record.engine is not None
            assert record.engine.status == "built", record.engine
    assert f"**{len(QUICK_SAMPLES)} of {len(QUICK_SAMPLES)}** model families' layers" in markdown


def _check_latency(out: Path, markdown: str, schemes: set[str]) -> None:
    latency = _section(markdown, "Latency")
    assert re.search(r"\*\*\d+\.\d GB/s\*\*", latency), "copy bandwidth missing"
    bench = json.loads((out / "bench" / "bench.json").read_text())
    assert bench["status"] == "complete"
    timed = {r["scheme"] for r in bench["results"] if r["unit"] == "block" and r["status"] == "ok"}
    assert timed == schemes
    for scheme in schemes:
        rows = [line for line in latency.splitlines() if line.startswith(f"| {scheme} | block |")]
        assert rows, scheme
        for row in rows:  # torch, ort-cpu and ort-cpu-fused columns hold times
            assert len(re.findall(r"\d+\.\d+ (?:ms|µs) \(", row)) >= 3, row
    # the decode step against its bytes floor, both cache layouts (the in-place one timed beside the concat one)
    for layout in ("concat", "in-place"):
        pattern = rf"\| rope \| {layout} \| decode B=1 S=1 P=\d+ \| ort-cpu-fused \| [\d.]+ (?:ms|µs) \|"
        assert re.search(pattern, latency), layout
    for backend in ("ort-cuda", "tensorrt"):  # missing backends: skipped, with the reason
        records = [r for r in bench["results"] if r["backend"] == backend]
        assert records
        assert all(r["status"] == "skipped" and r["reason"] for r in records)
        assert records[0]["reason"] in markdown


def _check_engines_and_plots(out: Path, markdown: str, schemes: set[str]) -> None:
    engines = _table_rows(_section(markdown, "TensorRT engine builds"))
    assert set(engines) == schemes
    expected = "PASS" if available_backends() else "SKIPPED"  # the dev install has tensorrt_rtx: every block builds
    for cells in engines.values():
        assert cells[2].split(" ")[0] == expected, cells
    for png in ("rope_decay.png", "error_vs_position.png", "latency.png", "roofline.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert f"]({png})" in markdown
    decay = _section(markdown, "RoPE long-range decay")
    for citation in ("arXiv:2104.09864", "https://kexue.fm/archives/8265"):  # sources a reader can look up
        assert citation in decay, citation


def _check_html(out: Path, schemes: set[str]) -> None:
    page = (out / "report.html").read_text()
    references = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)["']""", page)
    assert len(references) == 4
    assert all(r.startswith("data:image/png;base64,") for r in references)
    assert "<link" not in page
    assert "<script" not in page
    assert "url(" not in page
    for scheme in schemes:
        assert f"<td>{scheme}</td>" in page
    assert '<span class="pass">PASS</span>' in page


@pytest.mark.parametrize(
    "chosen",
    [
        pytest.param(DEFAULT_RUN, id="rope-and-dynamic-only"),
        pytest.param((), id="every-scheme", marks=pytest.mark.slow),
    ],
)
def test_quick_demo_writes_a_complete_self_contained_report(tmp_path, chosen: tuple[str, ...]) -> None:
    out = tmp_path / "report"
    assert main(["demo", "--quick", "--quiet", "-o", str(out), *(["-s", ",".join(chosen)] if chosen else [])]) == 0
    schemes = set(chosen or scheme_names())
    markdown = (out / "report.md").read_text()
    _check_parity(out, markdown, schemes)
    _check_checkpoints(out, markdown)
    _check_latency(out, markdown, schemes)
    _check_engines_and_plots(out, markdown, schemes)
    _check_html(out, schemes)


def test_unknown_scheme_is_a_clear_error(tmp_path, capsys) -> None:
    assert main(["demo", "--quick", "-s", "rope,ropey", "-o", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "unknown scheme 'ropey'; valid schemes are" in err
    assert not (tmp_path / "r").exists()
