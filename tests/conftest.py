"""Shared fixtures: one small real demo corpus on disk for the whole session."""
from __future__ import annotations

import pathlib

import pytest

from flight_overlord.demo.data import make_demo_data


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("corpus")
    make_demo_data(root, seed=0, scale=0.03)
    return root
