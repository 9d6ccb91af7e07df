"""Shared fixtures: one small real demo corpus on disk for the whole session, and one deployment
over it that tests only look at."""
from __future__ import annotations

import os
import pathlib
from typing import NamedTuple

import pytest

from flight_overlord.demo.data import make_demo_data
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.source_catalog import CATALOG_DIR_ENV

from .helpers import DEMO_SCALE, DEMO_SEED, write_config


@pytest.fixture(scope="session", autouse=True)
def catalog_cache(tmp_path_factory) -> pathlib.Path:
    """The session's catalog cache (role processes inherit it): never the user's ~/.cache."""
    folder = tmp_path_factory.mktemp("catalogs")
    before = os.environ.get(CATALOG_DIR_ENV)
    os.environ[CATALOG_DIR_ENV] = str(folder)
    yield folder
    if before is None:
        os.environ.pop(CATALOG_DIR_ENV, None)
    else:
        os.environ[CATALOG_DIR_ENV] = before


class DemoCorpus(NamedTuple):
    root: pathlib.Path
    files: dict[str, list[pathlib.Path]]  # make_demo_data's answer: {source: [parquet paths]}, in its order


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory) -> DemoCorpus:
    """The demo corpus, made once: text and image-text sources and tokenizer.json. Read-only: a test
    that breaks files works on a copy."""
    root = tmp_path_factory.mktemp("corpus")
    return DemoCorpus(root, make_demo_data(root, seed=DEMO_SEED, scale=DEMO_SCALE))


@pytest.fixture(scope="session")
def corpus(demo_corpus) -> pathlib.Path:
    return demo_corpus.root


@pytest.fixture(scope="session")
def idle_cluster(corpus, tmp_path_factory):
    """A deployment of ``write_config``'s default config that no trainer advances, for tests that
    only look at what it offers (list, describe, read step 0, in any order). A test that asks for a
    later step, sends bad input or stops a role starts its own cluster."""
    with LocalCluster(write_config(tmp_path_factory.mktemp("idle"), corpus)) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def plugin_file(tmp_path_factory) -> pathlib.Path:
    """A user's transform file (``shifted_bytes``), written once: a plugin registers its names once per
    process, so every config of the session names this one file."""
    from .corpora import PLUGIN_SOURCE
    path = tmp_path_factory.mktemp("plugins") / "their_transforms.py"
    path.write_text(PLUGIN_SOURCE)
    return path


@pytest.fixture(scope="session")
def recovery_reference(corpus, tmp_path_factory):
    """The undisturbed run of ``test_recovery``'s config, made once for the session: the failure tests
    of several modules (kill -9, hangs) compare every rank's stream with it."""
    from .integration.test_recovery import config, run
    return run(config(tmp_path_factory.mktemp("reference"), corpus))
