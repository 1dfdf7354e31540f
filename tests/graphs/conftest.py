"""Fixtures of the graph-pass tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.graphs.artifacts import shared_folder


@pytest.fixture(scope="session")
def graph_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Exports shared by every test of the session (and across xdist workers)."""
    return shared_folder(tmp_path_factory)
