"""Data order mid-run (issue 21) and the audit (issue 23): kill a run, edit its config (drop a
source, add one, reweight), resume; reweight live with ``overlord mix`` and kill after it. A stock
Flight client reads every step and checks exactly-once, the sources present and the realized
mixture; ``overlord audit`` must agree with the client's own count. The shuffle window keeps a
stream identical across loader counts and a kill and resume."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import yaml

from flight_overlord.client import StepFetcher
from flight_overlord.config import ConfigError, load_config
from flight_overlord.deploy import cli
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.loader.row_groups import read_catalog
from flight_overlord.planner.feed import SourceFeed

from ..helpers import WEIGHTS, write_config

RANKS = 2


def read_steps(planner: str, steps: range, ranks: int = RANKS) -> dict[int, list[tuple[str, int]]]:
    """Per step, every rank's (key, tokens), the ranks in lock-step, each step a rank stream's one-step slice."""
    fetchers = [StepFetcher(planner, rank, timeout=120) for rank in range(ranks)]
    out = {}
    try:
        for step in steps:
            out[step] = []
            for fetcher in fetchers:
                table = fetcher.fetch(step)
                for keys, cu in zip(table.column("sample_keys").to_pylist(), table.column("cu_seqlens").to_pylist()):
                    out[step].extend(zip(keys, np.diff(cu).tolist()))
    finally:
        for fetcher in fetchers:
            fetcher.close()
    return out


def kill_all(cluster: LocalCluster) -> None:
    for child in cluster.children:
        child.process.kill()
    cluster.stop()


def token_shares(delivered: dict[int, list], steps) -> dict[str, float]:
    tokens = Counter()
    for step in steps:
        for key, n in delivered[step]:
            tokens[key.split(":", 1)[0]] += n
    total = sum(tokens.values())
    return {s: n / total for s, n in tokens.items()}


def sources_config(tmp_path, corpus, weights: dict[str, float], *, loaders: dict | None = None, window: int = 2,
                   **overrides):
    path = write_config(tmp_path, corpus, checkpoint={"every": 4}, loader={"hosts": 0}, **overrides)
    raw = yaml.safe_load(path.read_text())
    raw["sources"] = [{"name": n, "paths": f"{n}/*.parquet", "weight": w, "loaders": (loaders or {}).get(n, 1),
                       "shuffle_window": window} for n, w in weights.items()]
    path.write_text(yaml.safe_dump(raw))
    return path


def audit(target: str, capsys, *flags) -> dict:
    cli.main(["audit", target, "--json", *flags])
    return json.loads(capsys.readouterr().out)


def order_position(cfg, source: str) -> dict[str, int]:
    """Each sample key's position in its source's epoch-0 read order (the Planner's feed, every row
    counted: the demo corpus has no empty sample)."""
    spec = cfg.source(source)
    catalog = read_catalog(spec)
    feed = SourceFeed(source, catalog, cfg.seed, lambda epoch, rg: {"num_tokens": np.ones(rg.num_rows, np.int64)},
                      spec.shuffle_window)
    return {feed.next().ref.key: i for i in range(sum(rg.num_rows for rg in catalog))}


def test_resume_on_an_edited_config_drops_adds_reweights_and_readds(corpus, tmp_path, capsys):
    first = {k: v for k, v in WEIGHTS.items() if k != "qa"}          # qa is added at the resume
    path = sources_config(tmp_path, corpus, first)
    cut, seen = 9, 11
    with LocalCluster(path) as cluster:
        before = read_steps(cluster.planner, range(seen))  # the trainers got past their checkpoint at `cut`
        kill_all(cluster)
    edited = {"captions": 0.1, "longdocs": 0.4, "code": 0.2, "docstrings": 0.1, "qa": 0.2}  # manuals dropped
    sources_config(tmp_path, corpus, edited)
    with LocalCluster(path, mode="resume") as cluster:
        after = read_steps(cluster.planner, range(cut, cut + 14))
        live = audit(cluster.planner, capsys)
        kill_all(cluster)
    kept = {s: before[s] for s in range(cut)}
    keys = [k for d in (kept, after) for step in d.values() for k, _ in step]
    assert len(keys) == len(set(keys)), "a sample was delivered twice across the edit"
    sources_after = {k.split(":", 1)[0] for step in after.values() for k, _ in step}
    assert "manuals" not in sources_after and "qa" in sources_after
    assert any(k.startswith("manuals:") for step in kept.values() for k, _ in step)
    shares = token_shares(after, after)
    for source, weight in edited.items():
        assert abs(shares.get(source, 0.0) - weight) <= 0.02, (source, shares)
    offline = audit(str(load_config(path).run_dir), capsys)
    for report in (live, offline):
        assert report["duplicates"] == 0 and report["missing"] == 0
        assert report["samples"] == len(keys)
        assert report["per_source"]["qa"]["samples"] == sum(k.startswith("qa:") for k in keys)
        assert [p["from_step"] for p in report["phases"]] == [0, cut]
        assert "manuals" not in report["phases"][1]["samples"]

    # manuals comes back: it continues where it stopped (its cursor stayed in the Planner's state)
    sources_config(tmp_path, corpus, {**edited, "manuals": 0.2})
    resume_at = cut + 14
    with LocalCluster(path, mode="resume") as cluster:
        again = read_steps(cluster.planner, range(resume_at, resume_at + 8))
    manuals_before = [k for step in kept.values() for k, _ in step if k.startswith("manuals:")]
    manuals_again = [k for step in again.values() for k, _ in step if k.startswith("manuals:")]
    assert manuals_again and not set(manuals_again) & set(manuals_before)
    position = order_position(load_config(path), "manuals")
    taken = sorted(position[k] for k in manuals_before + manuals_again)
    slack = 8  # planned-but-deferred samples of the last steps are not delivered yet
    assert taken[-1] < len(taken) + slack, "the re-added source skipped ahead instead of continuing"
    report = audit(str(load_config(path).run_dir), capsys)
    assert report["duplicates"] == 0 and report["missing"] == 0
    assert report["samples"] == len(keys) + sum(len(s) for s in again.values())


def test_live_mix_then_kill_and_resume(corpus, tmp_path, capsys):
    path = sources_config(tmp_path, corpus, WEIGHTS)
    at, cut = 8, 12  # at: past what the Planner plans after the stock reads of steps 0-2 (2 + prefetch + PLAN_AHEAD)
    new = {"captions": 0.1, "longdocs": 0.5, "code": 0.3, "qa": 0.1}
    with LocalCluster(path) as cluster:
        before = read_steps(cluster.planner, range(3))
        # sources not named keep their weight; --dry-run shows the weights that would be in force, changes nothing
        cli.main(["mix", cluster.planner, "--config", str(path), "--at", str(at), "--set", "code=0.5", "--dry-run"])
        shown = capsys.readouterr().out.splitlines()
        assert shown[0] == (f"dry run, nothing changed; from step {at}: captions=0.15 (12%) longdocs=0.25 (19%) "
                            f"code=0.5 (38%) docstrings=0.15 (12%) manuals=0.15 (12%) qa=0.1 (8%)")
        assert shown[1].startswith("until then: captions=0.15 (15%) longdocs=0.25 (25%) code=0.2 (20%)")
        cli.main(["mix", cluster.planner, "--config", str(path), "--at", str(at), "--only",
                  "--set", ",".join(f"{k}={v}" for k, v in new.items())])
        assert capsys.readouterr().out.startswith(f"from step {at}: captions=0.1 (10%) longdocs=0.5 (50%) code=0.3 "
                                                  f"(30%) docstrings=0 (0%) manuals=0 (0%) qa=0.1 (10%)")
        with pytest.raises(SystemExit, match="every source would weigh 0"):
            cli.main(["mix", cluster.planner, "--config", str(path), "--only", "--set", "qa=0"])
        cli.main(["status", cluster.planner, "--json"])
        status = json.loads(capsys.readouterr().out)
        assert status["planner"]["counters"]["mixture"]["pending"] == [
            {"step": at, "weights": {s: new.get(s, 0.0) for s in WEIGHTS}}]
        with pytest.raises(SystemExit, match="already planned"):
            cli.main(["mix", cluster.planner, "--config", str(path), "--at", "0", "--set", "qa=1"])
        with pytest.raises(SystemExit, match="unknown source 'web'"):
            cli.main(["mix", cluster.planner, "--config", str(path), "--set", "web=1"])
        with pytest.raises(SystemExit, match="Unauthenticated|unauthenticated|secret"):
            cli.main(["mix", cluster.planner, "--set", "qa=1"])  # no cluster secret: refused
        before.update(read_steps(cluster.planner, range(3, cut + 2)))
        kill_all(cluster)
    with LocalCluster(path, mode="resume") as cluster:
        after = read_steps(cluster.planner, range(cut, cut + 14))
    delivered = {**{s: before[s] for s in range(cut)}, **after}
    keys = [k for step in delivered.values() for k, _ in step]
    assert len(keys) == len(set(keys))
    shares = token_shares(delivered, range(at, cut + 14))
    for source in WEIGHTS:
        assert abs(shares.get(source, 0.0) - new.get(source, 0.0)) <= 0.02, (source, shares)
    report = audit(str(load_config(path).run_dir), capsys)
    assert report["duplicates"] == 0 and report["missing"] == 0 and report["samples"] == len(keys)
    assert [(p["from_step"], [e["kind"] for e in p["edits"]]) for p in report["phases"]] == [(0, []), (at, ["mix"])]
    cli.main(["audit", str(load_config(path).run_dir)])  # as a reader sees it: its words explained, no blank line
    text = capsys.readouterr()
    assert all(line.strip() for line in text.out.splitlines()) and "INFO" not in text.out + text.err
    assert "missing: samples planned for steps 0-" in text.out and f"steps {at}- (mix): captions=" in text.out


def test_resume_refuses_a_source_whose_files_changed(corpus, tmp_path):
    import shutil
    data = tmp_path / "data"
    for source in ("code", "qa"):
        shutil.copytree(corpus / source, data / source)
    path = sources_config(tmp_path, data, {"code": 0.5, "qa": 0.5})
    with LocalCluster(path) as cluster:
        read_steps(cluster.planner, range(2))
    sources_config(tmp_path, data, {"code": 0.5, "qa": 0.5}, window=3)  # the cursors count windows of 2
    with pytest.raises(ConfigError, match=r"sources.code.shuffle_window: 2 when the run started, 3 now"):
        LocalCluster(path, mode="resume").start()
    sources_config(tmp_path, data, {"code": 0.5, "qa": 0.5})
    victim = sorted((data / "qa").glob("*.parquet"))[0]
    shutil.copy(sorted((data / "code").glob("*.parquet"))[0], victim)  # other contents under the same name
    cluster = LocalCluster(path, mode="resume")
    with pytest.raises(ConfigError, match="sources.qa: its files changed"):
        cluster.start()
    assert not cluster.children, "a role started before the check"


def test_shuffle_window_streams_are_identical_across_loader_counts_and_a_kill(corpus, tmp_path):
    steps, cut = 16, 8
    path = sources_config(tmp_path / "a", corpus, WEIGHTS, window=4)
    with LocalCluster(path) as cluster:
        reference = read_steps(cluster.planner, range(steps))
    path = sources_config(tmp_path / "b", corpus, WEIGHTS, window=4, loaders={"captions": 2, "code": 3})
    with LocalCluster(path) as cluster:
        first = read_steps(cluster.planner, range(cut + 2))
        kill_all(cluster)
    with LocalCluster(path, mode="resume") as cluster:
        rest = read_steps(cluster.planner, range(cut, steps))
    assert {**{s: first[s] for s in range(cut)}, **rest} == reference
    captions = [k for step in reference.values() for k, _ in step if k.startswith("captions:")]
    groups = {tuple(k.split(":")[1:3]) for k in captions[:40]}
    assert len(groups) > 1, "the first samples of a source came from one row group: no window"
