"""`posenc models --census` end to end on a sample of types: worker processes, posenc's own export and validate,
the path and parity read back, the cache, the page, and a type stopped by its time limit.

The sample: gemma2 (loads today; a sliding and a full layer kind), phi (refused today: its reason must be the one
`posenc export` prints for that checkpoint), mamba (no attention layer). Under ``slow``: t5 and bart (an encoder
and a decoder stack, exported with --layer-type), llava and qwen2_vl (multimodal: a text tower).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from posenc.census.report import counts, type_path
from posenc.census.tiny import save_tiny_model, tiny_config
from posenc.cli import main

SAMPLE = "gemma2,phi,mamba"


@pytest.fixture(scope="module")
def census(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, Path]:
    folder = tmp_path_factory.mktemp("census")
    cache, page = folder / "models.json", folder / "models.md"
    argv = ["models", "--census", "--types", SAMPLE, "-j", "2", "--cache", str(cache), "-o", str(page), "--quiet"]
    assert main(argv) == 0
    return cache, json.loads(cache.read_text()), page


def _attention_kinds(entry: dict) -> list[dict]:
    return [k for k in entry["layers"] if k["attention"]]


def _exported_and_matching(kind: dict) -> None:
    assert kind["path"] in ("family", "alias", "tower", "trace"), kind
    assert kind["export_status"] == 0, kind
    assert kind["parity"]["passed"], kind
    assert kind["parity"]["worst_hf"] <= 1e-5, kind
    assert kind["parity"]["rows"] > 0


def test_a_type_that_loads_today_exports_every_layer_kind_and_matches_its_module(census) -> None:
    _, data, _ = census
    gemma2 = data["types"]["gemma2"]
    assert gemma2["scheme"] == "RoPE"
    kinds = _attention_kinds(gemma2)
    assert {("sliding_attention" in k["label"], "full_attention" in k["label"]) for k in kinds} == {
        (True, False),
        (False, True),
    }
    for kind in kinds:
        _exported_and_matching(kind)
        assert kind["path"] == "family"
        assert kind["family"] == "gemma"
        assert kind["posenc_scheme"] == "rope"


@pytest.mark.slow
def test_stacks_and_text_towers(tmp_path: Path) -> None:
    cache = tmp_path / "c.json"
    argv = ["models", "--census", "--types", "t5,bart,llava,qwen2_vl", "-j", "2", "--cache", str(cache)]
    assert main([*argv, "-o", str(tmp_path / "m.md"), "--quiet"]) == 0
    types = json.loads(cache.read_text())["types"]
    for name in ("t5", "bart"):
        kinds = _attention_kinds(types[name])
        assert [(k["stack"], k["layer"]) for k in kinds] == [("encoder", 0), ("decoder", 0)]
        for kind in kinds:
            _exported_and_matching(kind)
    for kind in _attention_kinds(types["qwen2_vl"]):
        _exported_and_matching(kind)
    assert types["llava"]["kind"] == "multimodal"
    assert types["llava"]["text_type"] == "llama"
    for kind in _attention_kinds(types["llava"]):  # refused until text towers load; then a tower that matches
        if kind["path"] != "refused":
            _exported_and_matching(kind)
            assert kind["path"] == "tower"


def test_a_refused_type_records_the_reason_posenc_export_prints(census, tmp_path: Path, capsys) -> None:
    _, data, _ = census
    (phi,) = _attention_kinds(data["types"]["phi"])
    checkpoint = tmp_path / "phi"
    save_tiny_model(tiny_config("phi").config, "PhiForCausalLM", checkpoint)
    status = main(["export", "--hf-model", str(checkpoint), "--layer", "0", "-o", str(tmp_path / "phi.onnx")])
    printed = capsys.readouterr().err
    if status == 0:  # phi has a path now: the census must have exported and matched it
        assert phi["path"] != "refused"
        assert phi["parity"]["passed"]
        return
    assert phi["path"] == "refused"
    assert phi["export_status"] == status == 2
    message = printed.split(": error: ", 1)[1].split("; supported model types:")[0]

    def same(text: str) -> str:  # the checkpoint folders differ
        return re.sub(r"/\S+", "<path>", text).strip().rstrip(".")

    assert same(phi["reason"]) == same(message)
    assert "phi" in phi["reason"]


def test_a_type_without_attention_exports_nothing(census) -> None:
    _, data, _ = census
    mamba = data["types"]["mamba"]
    assert mamba["scheme"] == "none (no attention)"
    assert not _attention_kinds(mamba)
    assert type_path(mamba) == "no attention"
    assert all("export_status" not in k for k in mamba["layers"])


def test_the_page_shows_the_cached_results(census) -> None:
    _, data, page = census
    text = page.read_text()
    summary = counts(data["types"])
    for path, n in summary["by_path"].items():
        assert f"| {path} | {n} |" in text
    for name, entry in data["types"].items():
        row = next(line for line in text.splitlines() if line.startswith(f"| {name} |"))
        assert f"| {type_path(entry)} |" in row
    assert re.search(rf"\*\*{summary['positional_passed']} of the {summary['positional']} types", text)


def test_a_rerun_uses_the_cache(census, capsys) -> None:
    cache, data, page = census
    argv = ["models", "--census", "--types", SAMPLE, "--cache", str(cache), "-o", str(page)]
    assert main(argv) == 0
    assert "3 text model types, 0 to run (3 cached)" in capsys.readouterr().err
    assert json.loads(cache.read_text())["types"] == data["types"]


def test_a_type_past_its_time_limit_is_recorded_and_the_census_goes_on(tmp_path: Path) -> None:
    cache = tmp_path / "c.json"
    argv = [
        "models",
        "--census",
        "--types",
        "gpt2",
        "--timeout",
        "0.5",
        "--cache",
        str(cache),
        "-o",
        str(tmp_path / "m.md"),
    ]
    assert main([*argv, "--quiet"]) == 0
    entry = json.loads(cache.read_text())["types"]["gpt2"]
    assert entry["status"] == "timeout"
    assert "stopped after 0 s" in entry["reason"]
    assert type_path(entry) == "timeout"


def test_bad_census_options_are_refused(tmp_path: Path, capsys) -> None:
    assert main(["models", "--census", "--types", "vit", "--cache", str(tmp_path / "c.json")]) == 2
    assert "takes no token ids" in capsys.readouterr().err
    assert main(["models", "--types", "llama"]) == 2
    assert "add --census" in capsys.readouterr().err


def test_posenc_help_does_not_load_the_census() -> None:
    """`posenc models` registers with argparse only: the census parts and transformers load when it runs."""
    import subprocess
    import sys

    code = (
        "import sys, posenc.cli; posenc.cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m.startswith(('posenc.census.', 'transformers'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['posenc.census.cli']"
