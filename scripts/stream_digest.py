"""Digest every rank's stream of shipped configs: the check that a refactoring changed no stream.

For each config named, brings the system up locally over a demo corpus, reads N steps for every
rank through a stock ``pyarrow.flight`` client (the ``("batch", step, rank)`` descriptor on the
Planner, the ticket redeemed where the endpoint says), and prints:

- per rank, a digest of its whole stream (every column of every table, in order);
- the fixed-seed plan hash: a digest of the journaled plans of those steps;
- a stock-client audit: delivered samples per source (distinct keys), and the sources the
  Planner's ``list_flights`` names.

Run it before and after a change and compare the outputs (``diff``): equal lines mean equal streams.

    python scripts/stream_digest.py --data DIR [--steps 8] [--deployment single_node] [CONFIG ...]

CONFIG names shipped configs (default: demo long_short_4d vlm long_context_hdp). DIR holds the demo
corpus (``overlord make-demo-data DIR``, which also writes the image sources) and, for
``long_context_hdp``, the long-tail source (``overlord make-demo-data DIR --long-tail 262144``).
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pyarrow.flight as fl
import yaml

from flight_overlord.config import load_config
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.harness import blake, plan_hash, stock_fetch, table_digest

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_CONFIGS = ["demo", "long_short_4d", "vlm", "long_context_hdp"]


def copy_config(name: str, data: Path, workdir: Path, deployment: str | None = None) -> Path:
    """The shipped config ``name`` with data_root and run_dir made absolute (and ``deployment`` if
    given), beside a copy of the shipped strategies (which configs name by relative path)."""
    raw = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    raw.update(data_root=str(data.resolve()), run_dir=str(workdir / "run"))
    if deployment:
        raw["deployment"] = deployment
    shutil.copytree(CONFIGS / "strategies", workdir / "strategies", dirs_exist_ok=True)
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def digest_config(name: str, data: Path, steps: int, deployment: str | None = None) -> list[str]:
    with tempfile.TemporaryDirectory(prefix=f"digest-{name}-") as tmp:
        path = copy_config(name, data, Path(tmp), deployment)
        cfg = load_config(path)
        clients: dict[str, fl.FlightClient] = {}

        def client_of(location: str) -> fl.FlightClient:
            if location not in clients:
                clients[location] = fl.FlightClient(location)
            return clients[location]

        streams: dict[int, list[str]] = {r: [] for r in range(cfg.mesh.world_size)}
        per_source: dict[str, set[str]] = {}
        with LocalCluster(path) as cluster:
            for step in range(steps):            # ranks in lock-step, as trainers go
                for rank in streams:
                    table = stock_fetch(client_of, cluster.planner, step, rank)
                    streams[rank].append(table_digest(table))
                    for keys in table.column("sample_keys").to_pylist():
                        for key in keys:
                            per_source.setdefault(key.split("/")[0].split(":")[0], set()).add(key)
            listed = sorted({f.descriptor.path[1].decode() for f in client_of(cluster.planner).list_flights()
                             if f.descriptor.path[0] == b"source"})
            for c in clients.values():
                c.close()
        lines = [f"{name} rank {r}: {blake(''.join(d).encode())}" for r, d in streams.items()]
        lines.append(f"{name} plan hash (steps 0..{steps - 1}): {plan_hash(cfg.run_dir, steps, root=Path(tmp))}")
        counts = Counter({s: len(k) for s, k in per_source.items()})
        lines.append(f"{name} audit: delivered distinct samples {sum(counts.values())}, per source "
                     + ", ".join(f"{s}={n}" for s, n in sorted(counts.items())))
        lines.append(f"{name} list_flights sources: {', '.join(listed)}")
        return lines


def main(argv: list[str]) -> None:
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="*", default=DEFAULT_CONFIGS, help="shipped config names")
    p.add_argument("--data", type=Path, required=True, help="the demo corpus dir")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--deployment", help="set the configs' deployment (say single_node: every role in one process); "
                   "the streams must not change")
    args = p.parse_args(argv)
    for name in args.configs:
        for line in digest_config(name, args.data, args.steps, args.deployment):
            print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
