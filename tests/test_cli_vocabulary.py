"""One CLI vocabulary: every subcommand spells and reads shared options alike; old spellings still work, with a note.

The checks walk the real parser (``posenc.cli.build_parser``): an option string that two subcommands take must mean
the same thing in both (destination, type, metavar, choices, action, and the shared help); the geometry options
must give the same attention geometry in ``export`` and ``bench``; every ``--help`` example and README command must
parse without a deprecation note; bad values exit 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections import defaultdict
from pathlib import Path

import pytest

from posenc.bench.shapes import Shape
from posenc.cli import build_parser, main
from posenc.cli_args import OPTIONS, parse_shape
from posenc.errors import ConfigError
from posenc.export import load_manifest
from posenc.export.kinds import UNITS
from posenc.export.shapes import SHAPE_PRESETS, FeedShape, named_shape_text

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("list", "show", "export", "optimize", "inspect", "build", "validate", "sweep", "bench", "demo", "models")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _visible_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS and a.dest != "help"]


def _meaning(action: argparse.Action) -> tuple[object, ...]:
    """What an option is, apart from its default, repeatability and the subcommand's note."""
    return (action.dest, action.type, action.metavar, action.choices)


def test_every_subcommand_is_walked() -> None:
    assert set(_subparsers(build_parser())) == set(COMMANDS)


def test_an_option_means_the_same_in_every_subcommand() -> None:
    seen: dict[str, dict[str, argparse.Action]] = defaultdict(dict)
    for command, sub in _subparsers(build_parser()).items():
        for action in _visible_options(sub):
            for flag in action.option_strings:
                seen[flag][command] = action
    shared = {flag: by_command for flag, by_command in seen.items() if len(by_command) > 1}
    assert {"--json", "-o", "--dtype", "--shape", "--num-heads", "--table-mode", "--layer", "--seed"} <= set(shared)
    for flag, by_command in shared.items():
        actions = list(by_command.values())
        dests = {a.dest for a in actions}
        assert len(dests) == 1, (flag, dests)
        option = OPTIONS.get(dests.pop())  # an option two subcommands take is defined once, in posenc.cli_args
        assert option is not None, f"{flag} is taken by {sorted(by_command)} but is not a shared option"
        for command, action in by_command.items():
            assert tuple(action.option_strings) == option.option_strings, (command, flag)
            assert action.help.startswith(option.help), (command, flag, action.help)
            assert action.type is option.type, (command, flag)
            assert action.metavar == option.metavar, (command, flag)
        kinds = {_meaning(a) for a in actions}
        assert len(kinds) == 1, (flag, kinds)


def test_a_shared_meaning_has_one_spelling() -> None:
    """No visible option stores into a shared destination under another name (the old `bench --heads`)."""
    for command, sub in _subparsers(build_parser()).items():
        for action in _visible_options(sub):
            if action.dest in OPTIONS:
                expected = OPTIONS[action.dest].option_strings
                assert tuple(action.option_strings) == expected, (command, action.option_strings)


def test_every_subcommand_prints_json_on_request() -> None:
    for command, sub in _subparsers(build_parser()).items():
        (json_option,) = [a for a in _visible_options(sub) if "--json" in a.option_strings]
        assert isinstance(json_option, argparse._StoreTrueAction), command  # a switch everywhere, never a file


def test_unit_choices_follow_the_export_units() -> None:
    assert OPTIONS["unit"].metavar == "{" + ",".join(UNITS) + "}"
    for unit in UNITS:
        assert OPTIONS["unit"].type(unit) == unit


def test_table_mode_choices_follow_the_table_modes() -> None:
    """The command line spells the table modes without importing torch; they are :class:`TableMode`'s values."""
    from posenc.cli_args import TABLE_MODES
    from posenc.schemes.base import TableMode

    assert tuple(mode.value for mode in TableMode) == TABLE_MODES


def test_geometry_derives_head_dim_the_same_way_in_export_and_bench(tmp_path: Path) -> None:
    """`--hidden-size 64 --num-heads 8` is head_dim 8 and 8 key/value heads in both (bench's default has 128/2)."""
    geometry = ["--hidden-size", "64", "--num-heads", "8", "--max-position-embeddings", "32"]
    out = tmp_path / "alibi.onnx"
    assert main(["export", "-s", "alibi", "--unit", "op", *geometry, "-o", str(out)]) == 0
    exported = load_manifest(out).attention
    bench = ["bench", "-s", "alibi", "--unit", "op", "--backend", "torch", "--shape", "1,4", *geometry]
    bench += ["--repeats", "1", "--warmup", "0", "--copy-mib", "1", "--copy-repeats", "1", "--no-plots", "--quiet"]
    assert main([*bench, "-o", str(tmp_path / "bench")]) == 0
    (record,) = json.loads((tmp_path / "bench" / "bench.json").read_text())["results"]
    timed = record["config"]
    for field in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
        assert exported[field] == timed[field], field
    assert (exported["head_dim"], exported["num_kv_heads"]) == (8, 8)


OLD_AND_NEW = [
    (["bench", "--heads", "4"], ["bench", "--num-heads", "4"], "--num-heads"),
    (["bench", "--kv-heads", "2"], ["bench", "--num-kv-heads", "2"], "--num-kv-heads"),
    (["bench", "--max-positions", "8192"], ["bench", "--max-position-embeddings", "8192"], "--max-position-embeddings"),
    (["bench", "--shape", "b=4,s=128"], ["bench", "--shape", "4,128"], "write 4,128,0"),
    (["bench", "--shape", "long:b=1,s=2048,past=3"], ["bench", "--shape", "long:1,2048,3"], "write long:1,2048,3"),
    (["bench", "--table-mode", "all"], ["bench", "--table-mode", "precomputed", "--table-mode", "dynamic"], "for all"),
    (["bench", "--table-mode", "auto"], ["bench"], "leave --table-mode out"),
    (["validate", "m.onnx", "--json", "p.json"], ["validate", "m.onnx", "--json-out", "p.json"], "--json-out"),
    (["validate", "m.onnx", "--json=p.json"], ["validate", "m.onnx", "--json-out", "p.json"], "--json-out"),
    (
        ["build", "m", "--target", "sm89", "-o", "e"],
        ["build", "m", "--engine-target", "sm89", "-o", "e"],
        "--engine-target",
    ),
    (
        ["build", "m", "--backend", "tensorrt", "-o", "e"],
        ["build", "m", "--trt-backend", "tensorrt", "-o", "e"],
        "--trt-backend",
    ),
    (
        ["sweep", "--max-position", "4096", "-o", "s"],
        ["sweep", "--last-position", "4096", "-o", "s"],
        "--last-position",
    ),
]


@pytest.mark.parametrize(("old", "new", "hint"), OLD_AND_NEW, ids=[" ".join(case[0]) for case in OLD_AND_NEW])
def test_old_spellings_parse_like_the_new_ones_and_warn(
    old: list[str], new: list[str], hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    expected = parser.parse_args(new)
    assert capsys.readouterr().err == ""
    assert parser.parse_args(old) == expected
    err = capsys.readouterr().err
    assert err.startswith(f"posenc {old[0]}: warning:") or err.startswith("posenc: warning:"), err
    assert "deprecated" in err or "old key=value form" in err
    assert hint in err


def test_old_validate_shape_options_still_parse_and_warn(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["validate", "m.onnx", "--batch", "2", "--seq", "1", "--past", "511"])
    assert (args.batch, args.seq, args.past) == (2, 1, 511)
    assert capsys.readouterr().err.count("is deprecated and goes in the next release; use --shape B,S,P") == 3


def test_json_is_a_switch_even_before_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    for argv in (["validate", "--json", "m.onnx"], ["validate", "m.onnx", "--json"]):
        args = parser.parse_args(argv)
        assert (args.model, args.json, args.json_out) == ("m.onnx", True, None)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("name", "feed"),
    [
        (None, FeedShape(1, 1)),
        (None, FeedShape(2, 7, 5)),
        ("long", FeedShape(1, 2048)),
        ("far", FeedShape(1, 4, 0, start=32764)),
        (None, FeedShape(3, 2, 9, start=9)),
    ],
)
def test_the_shape_syntax_round_trips(name: str | None, feed: FeedShape) -> None:
    text = named_shape_text(feed, name)
    assert parse_shape(text) == (name, feed)
    parser = build_parser()
    validate = parser.parse_args(["validate", "m.onnx", "--shape", text]).shape
    bench = parser.parse_args(["bench", "--shape", text]).shape
    assert validate == bench == [(name, feed)]  # one parser, one meaning
    assert Shape.named(name, feed).feed == feed
    if name is None:
        assert FeedShape.parse(text) == feed


def test_presets_are_shapes_in_the_one_syntax() -> None:
    assert {"prefill": FeedShape(1, 512), "decode": FeedShape(1, 1, 511)} == SHAPE_PRESETS
    for name, feed in SHAPE_PRESETS.items():
        assert parse_shape(name) == (name, feed)
        assert parse_shape(f"{name}:{feed.text}") == (name, feed)


def test_the_old_key_value_shape_form_still_parses_with_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_shape("long:b=2,s=1024") == ("long", FeedShape(2, 1024))
    assert parse_shape(" B=4, S=8, past=16 ") == (None, FeedShape(4, 8, 16))
    assert parse_shape("b=1,s=1,p=7") == (None, FeedShape(1, 1, 7))
    err = capsys.readouterr().err
    assert "write long:2,1024,0" in err
    assert "write 4,8,16" in err
    for text, fragment in (("b=1", "lacks s"), ("b=1,s=4,h=32", "unknown item"), ("b=1,b=2,s=4", "given twice")):
        with pytest.raises(ConfigError, match=fragment):
            parse_shape(text)


BAD_VALUES = [
    (["export", "--dtype", "fp8", "-o", "x.onnx"], "unknown dtype 'fp8'; use fp32, fp16 or bf16"),
    (["sweep", "--dtype", "fp64", "-o", "s"], "unknown dtype 'fp64'"),
    (["export", "--table-mode", "static", "-o", "x.onnx"], "unknown table mode 'static'"),
    (["bench", "--table-mode", "static"], "unknown table mode 'static'"),
    (["bench", "--unit", "layer"], "unknown unit 'layer'; use one of op, op-3d, block"),
    (["export", "--num-heads", "many", "-o", "x.onnx"], "argument --num-heads: invalid int value: 'many'"),
    (["bench", "--num-heads", "many"], "argument --num-heads: invalid int value: 'many'"),
    (["validate", "m.onnx", "--shape", "2"], "must be BATCH,SEQ[,PAST][@START]"),
    (["bench", "--shape", "2,x"], "must be BATCH,SEQ[,PAST][@START]"),
    (["bench", "--shape", "2,0"], "seq must be an int >= 1"),
    (["validate", "m.onnx", "--shape", "1,4,5@2"], "start must be an int >= past"),
    (["bench", "--shape", "prefil"], "or a preset: prefill, decode"),
    (["build", "m.onnx"], "the following arguments are required: -o/--output"),
    (["bench", "--bogus"], "unrecognized arguments: --bogus"),
    (["nonsense"], "invalid choice: 'nonsense'"),
]


@pytest.mark.parametrize(("argv", "fragment"), BAD_VALUES, ids=[" ".join(case[0]) for case in BAD_VALUES])
def test_bad_values_exit_2_with_one_line(
    argv: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    prefix = "posenc: error:" if argv[0] not in COMMANDS else f"posenc {argv[0]}: error:"
    assert captured.err.startswith(prefix), captured.err
    assert captured.err.count("\n") == 1, captured.err
    assert fragment in captured.err
    assert list(tmp_path.iterdir()) == []


def _example_commands(text: str) -> list[list[str]]:
    """``posenc ...`` lines of a help epilog or a README shell block (continuations joined, comments dropped)."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if line.startswith("posenc "):
            commands.append(shlex.split(line)[1:])
    return commands


def test_help_examples_use_the_one_vocabulary(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    for command, sub in _subparsers(parser).items():
        examples = _example_commands(sub.epilog or "")
        assert any(argv[0] == command for argv in examples), f"`posenc {command} --help` has no example of itself"
        for argv in examples:
            parser.parse_args(argv)
            assert capsys.readouterr().err == "", argv  # no deprecation note: examples speak the new vocabulary


def test_readme_commands_use_the_one_vocabulary(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    commands = [argv for block in blocks for argv in _example_commands(block)]
    assert commands
    parser = build_parser()
    for argv in commands:
        parser.parse_args(argv)
        assert capsys.readouterr().err == "", argv


def test_no_internal_document_names() -> None:
    """Sources are cited by title, authors, year and link, never by the project's internal document names."""
    pattern = re.compile(r"seed[ _-]?0\d|seed articles?|shared/seeds", re.IGNORECASE)
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    for folder in ("src", "tests", "scripts", "docs"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".txt", ".json", ".toml")]
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in files
        if path.is_file()
        for number, line in enumerate(path.read_text(errors="ignore").splitlines(), 1)
        if pattern.search(line) and "pattern = re.compile" not in line
    ]
    assert offenders == []
    assert pattern.search("see seed" + " 004")  # the check can fail
    assert pattern.search("_seed" + "002_theta")
