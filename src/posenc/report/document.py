"""A small report model rendered twice: Markdown (images as sibling files) and self-contained HTML.

The HTML has its CSS inline and every image embedded as a base64 ``data:`` URI, so it has no ``src`` or
``href`` pointing anywhere: it can be mailed or archived as one file.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.artifacts.files import write_text_atomic

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #1f2328; line-height: 1.45; }
h1 { border-bottom: 2px solid #d0d7de; padding-bottom: .3em; }
h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .8em 0; font-size: 13px; display: block; overflow-x: auto; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
tr:nth-child(even) td { background: #fbfcfd; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; background: #f6f8fa; border-radius: 4px; }
code { padding: 1px 4px; font-size: 90%; }
pre { padding: .8em; overflow-x: auto; }
figure { margin: 1em 0; }
figure img { max-width: 100%; border: 1px solid #d0d7de; }
figcaption { font-size: 13px; color: #57606a; }
.pass { color: #1a7f37; font-weight: 600; }
.fail { color: #cf222e; font-weight: 600; }
.skip { color: #9a6700; }
"""

_VERDICT_CLASSES = {"PASS": "pass", "FAIL": "fail", "MISS": "fail", "ERROR": "fail", "SKIP": "skip", "SKIPPED": "skip"}


def inline_html(text: str) -> str:
    """Escape ``text`` and render the inline Markdown the reports use: ``code``, **bold**, verdict words."""
    escaped = html.escape(text, quote=False)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    escaped = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(
        r"\b(PASS|FAIL|MISS|ERROR|SKIPPED|SKIP)\b",
        lambda m: f'<span class="{_VERDICT_CLASSES[m.group(1)]}">{m.group(1)}</span>',
        escaped,
    )


def _md_cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


@dataclasses.dataclass
class Block:
    """One piece of a report: ``kind`` is heading, text, table, image, code or bullets."""

    kind: str
    data: dict[str, Any]


@dataclasses.dataclass
class Report:
    """An ordered list of blocks with a title.

    Example::

        report = Report("posenc demo")
        report.heading("Parity")
        report.table(["scheme", "verdict"], [["rope", "PASS"]])
        report.image(Path("latency.png"), "latency per backend")
        report.write(Path("report"))   # report.md + report.html
    """

    title: str
    blocks: list[Block] = dataclasses.field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(Block("heading", {"text": text, "level": level}))

    def text(self, text: str) -> None:
        """A paragraph (inline Markdown: backticks and ** only)."""
        self.blocks.append(Block("text", {"text": text}))

    def bullets(self, items: Sequence[str]) -> None:
        self.blocks.append(Block("bullets", {"items": list(items)}))

    def code(self, text: str) -> None:
        self.blocks.append(Block("code", {"text": text}))

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]], caption: str = "") -> None:
        self.blocks.append(
            Block("table", {"headers": list(headers), "rows": [list(r) for r in rows], "caption": caption})
        )

    def image(self, path: Path, caption: str) -> None:
        """A PNG file; Markdown links it by file name (keep it in the report folder), HTML embeds it."""
        self.blocks.append(Block("image", {"path": Path(path), "caption": caption}))

    # -- rendering ---------------------------------------------------------------------------------

    def to_markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for block in self.blocks:
            d = block.data
            if block.kind == "heading":
                out += ["#" * d["level"] + " " + d["text"], ""]
            elif block.kind == "text":
                out += [d["text"], ""]
            elif block.kind == "bullets":
                out += [f"- {item}" for item in d["items"]] + [""]
            elif block.kind == "code":
                out += ["```", d["text"].rstrip("\n"), "```", ""]
            elif block.kind == "table":
                if d["caption"]:
                    out += [d["caption"], ""]
                out.append("| " + " | ".join(_md_cell(h) for h in d["headers"]) + " |")
                out.append("|" + "|".join("---" for _ in d["headers"]) + "|")
                out += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in d["rows"]]
                out.append("")
            elif block.kind == "image":
                out += [f"![{d['caption']}]({d['path'].name})", "", f"*{d['caption']}*", ""]
        return "\n".join(out).rstrip("\n") + "\n"

    def to_html(self) -> str:
        """One self-contained HTML page (inline CSS, images as base64 data URIs)."""
        body = [f"<h1>{inline_html(self.title)}</h1>"]
        for block in self.blocks:
            d = block.data
            if block.kind == "heading":
                level = min(max(int(d["level"]), 2), 6)
                body.append(f"<h{level}>{inline_html(d['text'])}</h{level}>")
            elif block.kind == "text":
                body.append(f"<p>{inline_html(d['text'])}</p>")
            elif block.kind == "bullets":
                body.append("<ul>" + "".join(f"<li>{inline_html(i)}</li>" for i in d["items"]) + "</ul>")
            elif block.kind == "code":
                body.append(f"<pre><code>{html.escape(d['text'])}</code></pre>")
            elif block.kind == "table":
                if d["caption"]:
                    body.append(f"<p>{inline_html(d['caption'])}</p>")
                head = "".join(f"<th>{inline_html(str(h))}</th>" for h in d["headers"])
                rows = "".join(
                    "<tr>" + "".join(f"<td>{inline_html(str(v))}</td>" for v in row) + "</tr>" for row in d["rows"]
                )
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
            elif block.kind == "image":
                data = base64.b64encode(Path(d["path"]).read_bytes()).decode("ascii")
                caption = inline_html(d["caption"])
                body.append(
                    f'<figure><img alt="{html.escape(d["caption"])}" src="data:image/png;base64,{data}">'
                    f"<figcaption>{caption}</figcaption></figure>"
                )
        return (
            '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{html.escape(self.title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body)
            + "\n</body>\n</html>\n"
        )

    def write(self, folder: str | Path, stem: str = "report") -> tuple[Path, Path]:
        """Write ``STEM.md`` and ``STEM.html`` into ``folder`` (atomically); images must already be there."""
        folder = Path(folder)
        md = write_text_atomic(folder / f"{stem}.md", self.to_markdown())
        page = write_text_atomic(folder / f"{stem}.html", self.to_html())
        return md, page
