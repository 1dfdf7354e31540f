"""Report rendering: Markdown tables, self-contained HTML."""

from __future__ import annotations

import re

from posenc.report import Report
from posenc.report.figures import new_figure, save_figure


def _png(path):
    figure = new_figure(2, 1)
    figure.subplots().plot([0, 1], [1, 0])
    return save_figure(figure, path)


def test_markdown_and_html_have_the_same_content(tmp_path) -> None:
    image = _png(tmp_path / "plot.png")
    report = Report("title <x>")
    report.heading("Parity")
    report.text("All **good**: `rope` PASS, `t5` FAIL.")
    report.table(["scheme", "verdict"], [["rope", "PASS"], ["a|b", "FAIL"]])
    report.image(image, "a plot")
    md_path, html_path = report.write(tmp_path)
    md = md_path.read_text()
    assert "| rope | PASS |" in md
    assert "| a\\|b | FAIL |" in md
    assert "![a plot](plot.png)" in md
    page = html_path.read_text()
    assert "<title>title &lt;x&gt;</title>" in page
    assert '<span class="pass">PASS</span>' in page
    assert "<code>rope</code>" in page
    assert "<strong>good</strong>" in page


def test_html_is_self_contained(tmp_path) -> None:
    image = _png(tmp_path / "plot.png")
    report = Report("r")
    report.image(image, "plot")
    page = report.to_html()
    sources = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert sources
    assert all(s.startswith("data:image/png;base64,") for s in sources)
    assert "<link" not in page
    assert "<script" not in page
