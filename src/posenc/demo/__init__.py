"""``posenc demo``: the whole pipeline for every registered scheme and every sample checkpoint, ending in a report.

Modules, lowest first: ``records`` (what each stage produced; ``demo.json``), ``stages`` (one stage, one engine),
``report`` (Markdown and HTML), ``checkpoints`` (the real-checkpoint section), ``pipeline`` (``run_demo``: the
worker pool, the benchmark, the report folder) and ``cli`` (``posenc demo``). A new stage is a record in
``records``, its step in ``pipeline`` (or ``checkpoints``) and its section in ``report``.
"""
