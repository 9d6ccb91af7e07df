#!/usr/bin/env python
"""Start-up against the file count: time to the first step, Planner and loader memory, run_dir bytes.

A corpus of 4 text sources (``--files`` files in all, each of ``--row-groups`` row groups of 32
rows; the files of a source are copies of one template, under /tmp by default) is started with
``overlord up``'s code path (``LocalCluster``: dp 2, one loader process hosting the 4 actors) and driven to its
first step by one ``StepFetcher`` per rank; then stopped and resumed (``mode="resume"``), driven
to the next step; then a new run of the same corpus (``rerun``: the catalogs the first start made
are there; the cache is emptied before each corpus and code). Per start, measured:

- ``first step s``: from the start call to every rank holding its first step;
- ``planner MiB`` / ``loaders MiB``: PSS (and RSS) of the Planner and of all loader processes at
  that moment;
- ``run_dir KB``: the bytes of the run_dir files that start wrote (a file rewritten counts whole).

Places: ``disk`` (local files) and ``s3+LATms`` (a moto S3 server on loopback behind a proxy that
holds every request ``--latency-ms``: an object store's round trip; ``--s3-files`` caps the files
there, as every one is uploaded through moto). Each start runs in its own process; ``--baseline
PYTHON`` runs every start once more with an interpreter whose ``flight_overlord`` is the old code, side
by side. Such an interpreter, for the code of ``main`` (an editable install's finder would win over
``PYTHONPATH``, hence a venv whose ``.pth`` names the old checkout and this venv's packages):

    git archive main | (mkdir -p /tmp/base && tar -x -C /tmp/base)
    ln -s ../../schemas /tmp/base/flight_overlord/wire/schema_files   # what pyproject's package-dir maps
    ln -s ../../configs /tmp/base/flight_overlord/demo/configs
    python3 -m venv --without-pip /tmp/basevenv
    .venv/bin/python -c "import site; print('/tmp/base'); print(site.getsitepackages()[0])" \
        > "$(/tmp/basevenv/bin/python -c 'import site; print(site.getsitepackages()[0])')/base.pth"

``--profile ROLE`` prints, instead of the table, where one fresh start and its resume of the first
``--files`` corpus spend their time in one role's process to the first step (cProfile, cumulative):
``up`` (the checks ``overlord up`` makes before any role starts), ``planner``, ``loader`` or
``constructor``.

    .venv/bin/python -m benchmarks.startup.file_count --files 1000,10000 --row-groups 1,10
    .venv/bin/python -m benchmarks.startup.file_count --files 100000 --row-groups 1 --profile loader
    .venv/bin/python -m benchmarks.startup.file_count --files 1000,10000,100000 --baseline /tmp/basevenv/bin/python \
        --plot docs/startup.png
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import benchlib
from benchmarks.common.benchlib import MiB, log

SOURCES = ("web", "code", "books", "qa")
ROWS_PER_GROUP = 32
BUCKET = "startup"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_EC2_METADATA_DISABLED": "true"}


def make_corpus(root: Path, files: int, row_groups: int) -> Path:
    """``files`` Parquet files over the 4 sources (copies of one template per source), made once."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    data = root / f"corpus-{files}x{row_groups}"
    if (data / "done").exists():
        return data
    shutil.rmtree(data, ignore_errors=True)
    started = time.monotonic()
    rng = np.random.default_rng(0)
    for i, name in enumerate(SOURCES):
        folder = data / name
        folder.mkdir(parents=True)
        rows = ROWS_PER_GROUP * row_groups
        texts = [" ".join(f"{name}{w}" for w in rng.integers(0, 1000, int(n))) for n in rng.integers(5, 200, rows)]
        template = folder / "part-000000.parquet"
        pq.write_table(pa.table({"text": texts}), template, row_group_size=ROWS_PER_GROUP)
        for f in range(1, files // len(SOURCES) + (i < files % len(SOURCES))):
            shutil.copyfile(template, folder / f"part-{f:06d}.parquet")
    (data / "done").touch()
    log(f"corpus: {files} files x {row_groups} row groups in {data} ({time.monotonic() - started:.0f}s)")
    return data


def write_config(run: Path, data: Path, paths) -> Path:
    return benchlib.write_config(run / "config.yaml", data, [{"name": n, "paths": paths(n)} for n in SOURCES],
                                 ranks=2, context_length=2048, microbatches=1, tokens_per_step=3000, seed=0,
                                 run_dir=run / "run", checkpoint={"every": 1})


def written_bytes(run_dir: Path, since: float) -> int:
    """Bytes of the files under ``run_dir`` modified at or after ``since`` (a rewritten file counts whole)."""
    return sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file() and p.stat().st_mtime >= since)


# A role process profiles itself from its start when its command line names BENCH_PROFILE_ROLE (python
# imports sitecustomize from PYTHONPATH first thing), and writes cProfile's top functions on SIGUSR1.
PROFILER = """import os, sys
if os.environ.get("BENCH_PROFILE_ROLE") in sys.argv:
    import cProfile, pstats, signal
    profile = cProfile.Profile()
    profile.enable()
    def dump(*_):
        profile.disable()
        with open(os.environ["BENCH_PROFILE_OUT"], "w") as out:
            pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(PROFILE_LINES)
    signal.signal(signal.SIGUSR1, dump)
"""
PROFILE_LINES = 40


def measure(config: Path, mode: str, step: int, profile: str | None = None) -> dict:
    """One start of ``config`` (in this process, with the code on ``sys.path``) to every rank's ``step``;
    ``profile``: a role (``up``: this process's part, the checks before the roles start) whose cProfile
    top functions the result carries."""
    import cProfile
    import io
    import pstats

    import psutil

    from flight_overlord.config import load_config
    from flight_overlord.deploy.launch import LocalCluster
    from flight_overlord.harness import fetch_steps
    cfg = load_config(config)
    if profile not in (None, "up"):
        profiler_dir = Path(tempfile.mkdtemp(prefix="bench-profile-"))
        (profiler_dir / "sitecustomize.py").write_text(PROFILER.replace("PROFILE_LINES", str(PROFILE_LINES)))
        os.environ.update(PYTHONPATH=os.pathsep.join(filter(None, [str(profiler_dir), os.environ.get("PYTHONPATH")])),
                          BENCH_PROFILE_ROLE=profile, BENCH_PROFILE_OUT=str(profiler_dir / "profile.txt"))
    up = cProfile.Profile() if profile == "up" else None
    since = time.time() - 1.0  # mtimes have a coarse clock on some file systems
    started = time.perf_counter()
    if up is not None:
        up.enable()
    with LocalCluster(config, mode=mode) as cluster:
        if up is not None:
            up.disable()
        fetch_steps(cluster.planner, cfg.mesh.world_size, step, step + 1, keep=False, timeout=600)
        seconds = time.perf_counter() - started
        memory: dict[str, list[int]] = {}
        for child in cluster.children:
            info = psutil.Process(child.process.pid).memory_full_info()
            role = benchlib.role_label(child.name)
            memory.setdefault(role, [0, 0])
            memory[role][0] += info.pss
            memory[role][1] += info.rss
        text = role_profile(cluster, profile) if profile not in (None, "up") else None
    if up is not None:
        out = io.StringIO()
        pstats.Stats(up, stream=out).sort_stats("cumulative").print_stats(PROFILE_LINES)
        text = out.getvalue()
    result = {"seconds": seconds, "memory": memory, "run_dir_bytes": written_bytes(cfg.run_dir, since)}
    return {**result, "profile": text} if profile else result


def role_profile(cluster, role: str) -> str:
    """The profile the first process of ``role`` wrote when asked (SIGUSR1), from its start to now."""
    import signal
    child = next(c for c in cluster.children if benchlib.role_label(c.name) == role)
    out = Path(os.environ["BENCH_PROFILE_OUT"])
    os.kill(child.process.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (out.exists() and out.stat().st_size):
        time.sleep(0.2)
    time.sleep(0.5)  # the file is written in one go; let it finish
    return out.read_text()


def start_in_process(python: str, config: Path, mode: str, step: int, env: dict, profile: str | None = None) -> dict:
    """``measure`` in a fresh process of interpreter ``python`` (its ``flight_overlord`` is the code measured)."""
    command = benchlib.module_command(__spec__.name, python)  # a measuring child imports its own flight_overlord
    out = subprocess.run([*command, "--measure", str(config), "--mode", mode, "--step", str(step),
                          *(["--profile", profile] if profile else [])],
                         env={**os.environ, **env}, cwd=config.parent, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise RuntimeError(f"start ({mode}, {python}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def three_starts(code: str, run: Path, config: Path, env: dict) -> dict:
    """The first start of the corpus (``fresh``), its ``resume``, and a new run of the same corpus (``rerun``)."""
    shutil.rmtree(run / "run", ignore_errors=True)
    starts = {"fresh": start_in_process(code, config, "new", 0, env),
              "resume": start_in_process(code, config, "resume", 1, env)}
    shutil.rmtree(run / "run")
    starts["rerun"] = start_in_process(code, config, "new", 0, env)
    return starts


def s3_corpus(data: Path, latency_ms: float):
    """(moto server context, paths function) for ``data`` uploaded to a moto S3 behind a latency proxy."""
    from benchmarks.common.s3 import LatencyProxy, moto_s3
    context = moto_s3(data, SOURCES, BUCKET, access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"])
    query, port, _ = context.__enter__()
    proxy = LatencyProxy(port, latency_ms / 1000)
    paths = lambda n: f"s3://{BUCKET}/{n}/*.parquet?endpoint_override=127.0.0.1:{proxy.port}&scheme=http&region=us-east-1"  # noqa: E731

    def close():
        proxy.close()
        context.__exit__(None, None, None)
    return paths, close


def row(place: str, files: int, row_groups: int, code: str, start: str, r: dict) -> dict:
    m = r["memory"]
    return {"place": place, "files": files, "row_groups": row_groups, "code": code, "start": start,
            "seconds": r["seconds"], "planner_pss": m["planner"][0] / MiB, "planner_rss": m["planner"][1] / MiB,
            "loaders_pss": m["loader"][0] / MiB, "loaders_rss": m["loader"][1] / MiB,
            "run_dir_kb": r["run_dir_bytes"] / 1000}


def print_row(r: dict) -> None:
    print(f"{r['place']:<10} {r['files']:>7} {r['row_groups']:>3} {r['code']:<9} {r['start']:<7} {r['seconds']:>8.2f} "
          f"{r['planner_pss']:>7.1f} {r['planner_rss']:>7.1f} {r['loaders_pss']:>8.1f} {r['loaders_rss']:>8.1f} "
          f"{r['run_dir_kb']:>9.1f}", flush=True)


def main() -> None:
    p = benchlib.argument_parser(__doc__)
    p.add_argument("--files", default="1000,10000", help="file counts, comma-separated (default 1000,10000)")
    p.add_argument("--row-groups", default="1,10", help="row groups per file, comma-separated (default 1,10)")
    p.add_argument("--places", default="disk,s3", help="disk, s3 or both (default)")
    p.add_argument("--s3-files", type=int, default=2000, help="at most this many files on S3 (default 2000)")
    p.add_argument("--latency-ms", type=float, default=20.0, help="held per S3 request (default 20)")
    p.add_argument("--max-row-groups", type=int, default=100_000, help="skip corpora of more row groups "
                   "(default 100000)")
    p.add_argument("--baseline", help="an interpreter whose flight_overlord is the old code, measured beside this one")
    p.add_argument("--workdir", type=Path, help="where corpora go (kept; default: a temp dir, removed)")
    p.add_argument("--json", type=Path, help="write every row here too")
    p.add_argument("--plot", type=Path, help="write a plot here (needs matplotlib: the bench extra)")
    p.add_argument("--replot", type=Path, help="only plot (--plot) the table of a saved output of this script")
    p.add_argument("--profile", choices=("up", "planner", "loader", "constructor"),
                   help="instead of the table: one fresh start and its resume of the first --files corpus (on "
                        "disk), each with cProfile's top functions by cumulative time in this role's process "
                        "(up: the checks overlord up makes before any role starts), to the first step")
    p.add_argument("--measure", type=Path, help=argparse_hidden())
    p.add_argument("--mode", default="new", help=argparse_hidden())
    p.add_argument("--step", type=int, default=0, help=argparse_hidden())
    args = p.parse_args()
    if args.measure:  # one start, in a child process (see start_in_process)
        print(json.dumps(measure(args.measure, args.mode, args.step, args.profile)))
        return
    if args.replot:
        plot(args.plot, parse_rows(args.replot.read_text()))
        return
    benchlib.print_header()
    # made absolute (each start runs in its config's folder), not resolved (a venv's python is a link)
    baseline = shutil.which(args.baseline) if args.baseline else None
    if args.baseline and baseline is None:
        p.error(f"--baseline {args.baseline}: no such interpreter")
    codes = [("new", sys.executable)] + ([("baseline", os.path.abspath(baseline))] if baseline else [])
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-startup-"))
    catalogs = work / "catalogs"  # the new code's catalog cache: this bench's own, removed with it
    env = {**CREDENTIALS, "OVERLORD_CATALOG_DIR": str(catalogs)}
    os.environ.update(CREDENTIALS)
    if args.profile:
        try:
            profile_starts(args, work, env)
        finally:
            if args.workdir is None:
                shutil.rmtree(work, ignore_errors=True)
        return
    rows: list[dict] = []
    print(f"\n4 sources, dp 2, {ROWS_PER_GROUP} rows per row group; first step s; PSS and RSS MiB; run_dir KB "
          f"written by the start")
    print(f"{'place':<10} {'files':>7} {'rgs':>3} {'code':<9} {'start':<7} {'first s':>8} {'pl PSS':>7} {'pl RSS':>7} "
          f"{'ld PSS':>8} {'ld RSS':>8} {'run_dir KB':>9}")
    try:
        for place in args.places.split(","):
            for files in map(int, args.files.split(",")):
                if place == "s3" and files > args.s3_files:
                    continue
                for row_groups in map(int, args.row_groups.split(",")):
                    if files * row_groups > args.max_row_groups:
                        continue
                    data = make_corpus(work, files, row_groups)
                    paths, close = (lambda n: f"{n}/*.parquet", lambda: None)
                    label = place
                    if place == "s3":
                        log(f"s3: uploading {files} files")
                        paths, close = s3_corpus(data, args.latency_ms)
                        label = f"s3+{args.latency_ms:g}ms"
                    try:
                        for code, where in codes:
                            run = work / f"run-{place}-{files}-{row_groups}-{code}"
                            run.mkdir(parents=True, exist_ok=True)
                            shutil.rmtree(catalogs, ignore_errors=True)  # a first start builds the catalog
                            log(f"{label}: {files} files x {row_groups}, {code}")
                            try:
                                result = three_starts(where, run, write_config(run, data, paths), env)
                            except RuntimeError as exc:  # e.g. the old code past its start-up timeout
                                last = str(exc).strip().splitlines()[-1]
                                print(f"{label:<10} {files:>7} {row_groups:>3} {code:<9} did not start: {last}",
                                      flush=True)
                                continue
                            for start in result:
                                rows.append(row(label, files, row_groups, code, start, result[start]))
                                print_row(rows[-1])
                            shutil.rmtree(run, ignore_errors=True)
                    finally:
                        close()
                    if args.workdir is None:
                        shutil.rmtree(data, ignore_errors=True)
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        if args.plot:
            plot(args.plot, rows)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def profile_starts(args, work: Path, env: dict) -> None:
    """``--profile``: a fresh start of the first corpus and its resume, each role profile printed."""
    files, row_groups = int(args.files.split(",")[0]), int(args.row_groups.split(",")[0])
    data = make_corpus(work, files, row_groups)
    run = work / f"run-profile-{files}-{row_groups}"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    config = write_config(run, data, lambda n: f"{n}/*.parquet")
    shutil.rmtree(work / "catalogs", ignore_errors=True)  # the fresh start builds the catalogs
    for mode, step in (("new", 0), ("resume", 1)):
        result = start_in_process(sys.executable, config, mode, step, env, args.profile)
        print(f"\n{files} files x {row_groups}, {'fresh' if mode == 'new' else mode}: first step in "
              f"{result['seconds']:.2f} s; {args.profile}'s profile to then:\n{result['profile']}", flush=True)
    shutil.rmtree(run, ignore_errors=True)


def parse_rows(text: str) -> list[dict]:
    """The rows ``print_row`` printed in ``text`` (a saved output)."""
    keys = ("place", "files", "row_groups", "code", "start", "seconds", "planner_pss", "planner_rss", "loaders_pss",
            "loaders_rss", "run_dir_kb")
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == len(keys) and parts[1].isdigit() and parts[3] in ("new", "baseline"):
            rows.append({k: v if i in (0, 3, 4) else (int(v) if i in (1, 2) else float(v))
                         for i, (k, v) in enumerate(zip(keys, parts))})
    return rows


def argparse_hidden():
    import argparse
    return argparse.SUPPRESS


def plot(path: Path, rows: list[dict]) -> None:
    """Local disk, 1 row group per file: each start of this code (solid) and of the baseline (dashed)
    against the file count (the other corpora are in the table)."""
    plt = benchlib.pyplot(path)
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = [("seconds", "time to first step (s)", "log"), ("planner_pss", "Planner PSS (MiB)", "linear"),
              ("run_dir_kb", "run_dir KB written per start", "log")]
    colours = {"fresh": "tab:red", "resume": "tab:blue", "rerun": "tab:green"}
    for ax, (key, title, yscale) in zip(axes, panels):
        for code in ("new", "baseline"):
            for start, colour in colours.items():
                points = sorted((r["files"], r[key]) for r in rows if (r["place"], r["row_groups"], r["code"],
                                                                       r["start"]) == ("disk", 1, code, start))
                if points:
                    ax.plot(*zip(*points), marker="o", color=colour, linestyle="-" if code == "new" else "--",
                            label=f"{'this code' if code == 'new' else 'main'}: {start}")
        ax.set_xscale("log")
        ax.set_yscale(yscale)
        ax.set_xlabel("files (1 row group each, local disk)")
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    benchlib.save_plot(fig, path)


if __name__ == "__main__":
    main()
