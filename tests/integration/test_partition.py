"""`overlord partition` and `loader.partition: auto` on the real demo corpus: the profile is journaled
and reused, the plan applied by every role; a cluster run with it delivers the same streams as the
config as written, every planned sample once; so does a run whose loaders buffer row groups sample-level.
One loader actor's read-ahead and buffer, in this process: tests/unit/test_loader_actor.py."""
from __future__ import annotations

import json

import pytest

from flight_overlord.config import ConfigError, load_config
from flight_overlord.core.partition_plan import GiB
from flight_overlord.deploy.cli import main
from flight_overlord.deploy.topology import loader_hosts

from ..helpers import delivered_keys, fetch_run, journal, write_config

AUTO = {"partition": "auto", "budget": {"cpus": 2, "memory_gib": 2}}


def test_overlord_partition_journals_the_profile_and_plans(corpus, tmp_path, capsys):
    path = write_config(tmp_path, corpus, loader=AUTO)
    main(["partition", str(path)])
    out = capsys.readouterr().out
    assert "partition plan:" in out and "measured now" in out
    assert "recommended `deployment: single_node`" in out  # for a node of the budget's cores and memory
    assert all(name in out for name in ("captions", "longdocs", "code", "docstrings", "manuals", "qa"))
    run_dir = load_config(path).run_dir
    profile = json.loads((run_dir / "partition" / "profile.json").read_text())
    assert [p["name"] for p in profile["sources"]] == [s.name for s in load_config(path).sources]
    assert all(p["seconds_per_sample"] > 0 and p["row_group_bytes"] > 0 for p in profile["sources"])
    cfg = load_config(path)  # loads with the plan applied
    plan = json.loads((run_dir / "partition" / "plan.json").read_text())
    assert {s.name: s.loaders for s in cfg.sources} == {s["name"]: s["actors"] for s in plan["sources"]}
    assert [a for _, actors in loader_hosts(cfg) for a in actors] == [tuple(a) for h in plan["hosts"] for a in h]
    assert len(plan["hosts"]) <= 2 and sum(plan["host_bytes"]) <= 2 * GiB
    main(["partition", str(path), "--cpus", "1"])  # the command line's budget wins; the profile is reused
    out = capsys.readouterr().out
    assert "reused" in out and "budget 1 CPUs" in out and len(load_config(path).loader.groups) == 1


@pytest.mark.parametrize("flags,message", [(["--cpus", "0"], "cpus must be a positive number"),
                                           (["--memory", "-1"], "memory (GiB) must be a positive number"),
                                           (["--memory", "0.01"], "leaves nothing for their actors")])
def test_bad_budgets_are_clear_errors(corpus, tmp_path, flags, message):
    path = write_config(tmp_path, corpus, loader=AUTO)
    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)")):
        main(["partition", str(path), *flags])


def test_budget_keys_are_validated(corpus, tmp_path):
    for loader, message in (({"partition": "sometimes"}, "loader.partition"),
                            ({"budget": {"cpus": -1}}, "loader.budget.cpus"),
                            ({"budget": {"memory": 3}}, "loader.budget.memory"),
                            ({"read_ahead_bytes": -5}, "loader.read_ahead_bytes")):
        with pytest.raises(ConfigError, match=message):
            load_config(write_config(tmp_path / message.replace(".", "-"), corpus, loader=loader))


def test_auto_partition_end_to_end_same_streams_every_sample_once(corpus, tmp_path):
    """A journaled profile in which longdocs' file states do not fit one host: the cluster starts
    with longdocs split in two actors on two hosts, and every rank's stream equals the run of the
    config as written (one actor per source, one process each)."""
    auto = write_config(tmp_path / "auto", corpus, loader=AUTO)
    main(["partition", str(auto)])
    profile_path = load_config(auto).run_dir / "partition" / "profile.json"
    profile = json.loads(profile_path.read_text())
    for p in profile["sources"]:
        # one cost per token, so the cost shares are the weights: a measured cost varies with the machine's
        # load, and longdocs' share could pass one host's and split it for cpu before memory is looked at
        p["seconds_per_sample"] = 1e-4 * p["mean_tokens"]
        if p["name"] == "longdocs":
            p["reader_bytes"] = 1.5 * GiB  # as if it had thousands of files
    profile_path.write_text(json.dumps(profile))
    (load_config(auto).run_dir / "partition" / "plan.json").unlink()
    steps = 8
    got = fetch_run(auto, steps)  # LocalCluster plans at start-up, reusing the journaled profile
    cfg = load_config(auto)
    assert cfg.source("longdocs").loaders == 2 and len(cfg.loader.groups) == 2
    hosts_of = {h for h, group in enumerate(cfg.loader.groups) for s, _ in group if s == "longdocs"}
    assert len(hosts_of) == 2
    assert "memory:" in " ".join(r for s in json.loads((cfg.run_dir / "partition" / "plan.json").read_text())["sources"]
                                 for r in s["reasons"])
    planned = [k for record in journal(auto)[:steps] for b in record["bins"] for k in b]
    delivered = [k for tables in got.values() for k in delivered_keys(tables)]
    assert sorted(delivered) == sorted(planned) and len(set(delivered)) == len(delivered)
    reference = fetch_run(write_config(tmp_path / "manual", corpus), steps)
    assert {r: [delivered_keys([t]) for t in tables] for r, tables in got.items()} == \
        {r: [delivered_keys([t]) for t in tables] for r, tables in reference.items()}


def test_sample_level_run_delivers_the_same_streams_every_sample_once(corpus, tmp_path):
    """A cluster whose loaders buffer every row group sample-level (a 1-byte bound): every rank's
    stream (keys, token ids, every column) equals the whole-row-group run's; each planned sample once."""
    steps = 6
    sampled_path = write_config(tmp_path / "sampled", corpus, loader={"sample_level_bytes": 1})
    sampled = fetch_run(sampled_path, steps)
    whole = fetch_run(write_config(tmp_path / "whole", corpus), steps)
    assert {r: [t.to_pydict() for t in tables] for r, tables in sampled.items()} == \
        {r: [t.to_pydict() for t in tables] for r, tables in whole.items()}
    planned = [k for record in journal(sampled_path)[:steps] for b in record["bins"] for k in b]
    delivered = [k for tables in sampled.values() for k in delivered_keys(tables)]
    assert sorted(delivered) == sorted(planned) and len(set(delivered)) == len(delivered)
