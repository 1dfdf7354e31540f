"""Citations: :class:`Citation` (authors, title, year, link; ``str()`` gives ``Authors, Title (year), link``), the one
form every scheme spec, rope type, report and docstring cites in, and the sources posenc cites besides each scheme's
own paper. Su Jianlin's posts are in Chinese; the bracketed titles are translations.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Citation:
    """Where a rule comes from: authors, title, year and a link."""

    authors: str
    title: str
    year: int
    link: str

    def __str__(self) -> str:
        """``Authors, Title (year), link``; arXiv links in their short form ``arXiv:ID``."""
        arxiv = "https://arxiv.org/abs/"
        link = f"arXiv:{self.link.removeprefix(arxiv)}" if self.link.startswith(arxiv) else self.link
        return f"{self.authors}, {self.title} ({self.year}), {link}"


SU_2021_POSITION_ENCODINGS = Citation(
    "Su Jianlin",
    "让研究人员绞尽脑汁的Transformer位置编码 [Transformer position encodings that keep researchers busy]",
    2021,
    "https://kexue.fm/archives/8130",
)
"""The survey of absolute and relative position encodings (sections 相乘式, 递归式, 经典式, XLNET式, T5式,
DeBERTa式): Shaw, Transformer-XL, T5's bucket table, DeBERTa, TUPE, multiplicative and ODE positions."""

SU_2021_ROPE = Citation(
    "Su Jianlin",
    "Transformer升级之路：2、博采众长的旋转式位置编码 "
    "[The road to upgrading Transformers 2: rotary position embedding]",
    2021,
    "https://kexue.fm/archives/8265",
)
"""RoPE's derivation, its long-range decay curve (section 远程衰减) and RoPE in linear attention (线性场景)."""

SU_2023_REROPE = Citation(
    "Su Jianlin",
    "Transformer升级之路：12、无限外推的ReRoPE？ "
    "[The road to upgrading Transformers 12: ReRoPE, infinite extrapolation?]",
    2023,
    "https://kexue.fm/archives/9708",
)
"""ReRoPE and Leaky ReRoPE: the relative position clipped (or slowed down) beyond a window."""

ZHAO_2023_LLM_SURVEY = Citation(
    "Zhao et al.",
    "A Survey of Large Language Models",
    2023,
    "arXiv:2303.18223; its book edition 大语言模型 [Large Language Models] (2024), https://llmbook-zh.github.io",
)
"""Position encodings (book §5.2) and long-context extension: scaling, truncation, ReRoPE (book §5.4)."""

__all__ = ["SU_2021_POSITION_ENCODINGS", "SU_2021_ROPE", "SU_2023_REROPE", "ZHAO_2023_LLM_SURVEY", "Citation"]
