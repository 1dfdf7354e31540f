"""posenc's batch entry points run with the collector thresholds of a batch job, and give the caller's back."""

from __future__ import annotations

import gc

import pytest

from posenc.cli import main
from posenc.process import BATCH_GC_THRESHOLDS, batch_gc


@pytest.fixture
def default_thresholds():
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield (700, 10, 10)
    gc.set_threshold(*saved)


def test_batch_gc_sets_the_thresholds_and_restores_the_callers(default_thresholds) -> None:
    with batch_gc():
        assert gc.get_threshold() == BATCH_GC_THRESHOLDS
        with batch_gc():
            assert gc.get_threshold() == BATCH_GC_THRESHOLDS
        assert gc.get_threshold() == BATCH_GC_THRESHOLDS
    assert gc.get_threshold() == default_thresholds
    with pytest.raises(RuntimeError), batch_gc():
        raise RuntimeError("a failing command")
    assert gc.get_threshold() == default_thresholds


def test_a_command_runs_under_them_and_leaves_the_callers(default_thresholds, monkeypatch, capsys) -> None:
    seen = []
    monkeypatch.setattr("posenc.cli.chosen_command", lambda argv: seen.append(gc.get_threshold()))
    assert main(["--version"]) == 0
    assert seen == [BATCH_GC_THRESHOLDS]
    assert gc.get_threshold() == default_thresholds
