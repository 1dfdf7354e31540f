"""Model families posenc loads checkpoints of; each module registers its :class:`~posenc.checkpoints.family.Family`.

To add a family, add a module here and import it below (see :mod:`posenc.checkpoints.family`).
"""

from posenc.checkpoints.families import (  # noqa: F401
    bart,
    bert,
    bloom,
    deberta,
    deepseek,
    falcon,
    gemma,
    gemma4,
    gpt_neox,
    gptj,
    hunyuan,
    llama,
    llama4,
    mimo,
    modernbert,
    mpt,
    phi,
    phi3,
    qwen_vl,
    t5,
)
