"""The ``overlord`` command."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from .. import allocator
from ..errors import ConfigError

# Relative to the current directory (an installed package has no repository to default into);
# from the repository's top they are the folders configs/*.yaml read (../data/demo, ../runs/demo).
DEFAULT_DATA_DIR = Path("data") / "demo"
DEFAULT_RUN_DIR = Path("runs") / "demo"


ROLES = ("planner", "loader", "constructor", "node")
QUERIES = ("inspect", "status", "mix", "audit", "skip")  # an operator's questions: warnings and errors only


def _serve(args) -> None:
    """One role in this process (``node``: every role of a single_node run); its own ``main`` parses the
    flags that follow the role's name."""
    import importlib
    if args.role in ("loader", "node") and args.command_line:
        allocator.without_thread_caches()  # may run this process again (exec), so first
    module = "flight_overlord.deploy.node" if args.role == "node" else f"flight_overlord.{args.role}.server"
    importlib.import_module(module).main(args.flags)


def _up(args) -> None:
    mode = "resume" if args.resume else "fresh" if args.fresh else "new"
    if args.backend == "ray":
        from .ray_backend import RayCluster
        cluster = RayCluster(args.config, address=args.address, mode=mode)
    else:
        from .launch import LocalCluster
        cluster = LocalCluster(args.config, mode=mode)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        try:
            planner = cluster.start()
        except (RuntimeError, TimeoutError) as exc:  # a role that could not start: its log's tail, not our traceback
            raise SystemExit(f"error: {exc}") from None
        print(planner, flush=True)
        logging.getLogger("overlord").info("all roles up; logs in %s; Ctrl-C to stop", cluster.cfg.run_dir / "logs")
        stop.wait()
    finally:
        cluster.stop()


def _partition(args) -> None:
    from ..config import load_config
    from ..loader.profile import partition
    cfg = load_config(args.config)
    _, table = partition(cfg, cpus=args.cpus, memory_gib=args.memory, reprofile=args.reprofile)
    print(table, flush=True)
    if cfg.loader.partition != "auto":
        print(f"note: {args.config} has loader.partition: manual; with `loader: {{partition: auto}}` the run "
              f"starts with this plan", flush=True)


def _make_demo_data(args) -> None:
    from .. import source_files
    if args.dir and source_files.is_uri(args.dir):  # made in a temporary folder, then uploaded
        import tempfile
        try:
            source_files.check_destination(args.dir)
            with tempfile.TemporaryDirectory(prefix="overlord-demo-") as tmp:
                _make_demo_data(argparse.Namespace(**{**vars(args), "dir": tmp}))
                written = source_files.upload_tree(tmp, args.dir)
        except source_files.StorageError as exc:
            raise SystemExit(f"error: {exc}") from None
        print(f"uploaded {len(written)} files to {source_files.display(args.dir)}")
        return
    from ..demo.data import make_demo_data, make_many_sources
    out = Path(args.dir) if args.dir else DEFAULT_DATA_DIR
    if args.long_tail is not None:
        from ..demo.long_tail import long_tail_name, make_long_tail
        try:
            written = {long_tail_name(args.long_tail): make_long_tail(out, long_tail_name(args.long_tail),
                                                                      rows=args.long_tail_rows,
                                                                      max_tokens=args.long_tail, seed=args.seed)}
        except ValueError as exc:
            raise SystemExit(f"error: make-demo-data --long-tail: {exc}") from None
    elif args.navit is not None or args.coyo:
        from ..demo.navit import make_coyo, make_navit
        rows = {} if args.rows_per_source is None else {"rows_per_source": args.rows_per_source}
        try:
            written = (make_navit(out, args.navit, seed=args.seed, **rows) if args.navit is not None
                       else make_coyo(out, seed=args.seed, **rows))
        except ValueError as exc:
            flag = "navit" if args.navit is not None else "coyo"
            raise SystemExit(f"error: make-demo-data --{flag}: {exc}") from None
    elif args.sources is not None:
        rows = 2000 if args.rows_per_source is None else args.rows_per_source
        written = make_many_sources(out, args.sources, seed=args.seed, rows_per_source=rows)
    else:
        written = make_demo_data(out, seed=args.seed, scale=args.scale)
    for source, files in written.items():
        print(f"{source}: {len(files)} files in {out / source}")


def _demo(args) -> None:
    from ..demo.run import run_demo, shipped_demo_config
    config = args.config
    if config is None:
        config = shipped_demo_config(args.data or DEFAULT_DATA_DIR, args.run_dir or DEFAULT_RUN_DIR)
        print(f"config: {config} (the shipped demo config)", flush=True)
    elif args.data or args.run_dir:
        raise SystemExit("error: --data and --run-dir apply to the shipped demo config; "
                         "with --config, set data_root and run_dir in that file")
    run_demo(config, steps=args.steps)


def _credentials(args):
    """The credentials an operator's command uses: the run's own (``--config``), or token and TLS files."""
    from ..wire.security import Credentials, Security
    if args.config:  # the run's own credentials: its cluster secret and TLS settings
        from ..config import load_config
        credentials = Security.from_config(load_config(args.config)).credentials
        if args.token_file:
            credentials = credentials.with_token(Credentials.from_files(token_file=args.token_file).token)
        return credentials
    return Credentials.from_files(token_file=args.token_file, ca=args.ca, cert=args.cert, key=args.key)


def _add_credential_args(p) -> None:
    p.add_argument("--token-file", help="a file holding an inspection or trainer token (first line)")
    p.add_argument("--ca", help="PEM file of the CA that signed the servers' certificates (grpc+tls://)")
    p.add_argument("--cert", help="client certificate (PEM), for mutual TLS")
    p.add_argument("--key", help="the client certificate's private key (PEM)")
    p.add_argument("--config", help="use the run's own credentials: its cluster secret (security.cluster_secret_file, "
                   "$OVERLORD_CLUSTER_SECRET or run_dir/secrets/) and TLS settings")


def _status(args) -> None:
    import json
    import time

    from .status import cluster_status, render
    credentials = _credentials(args)
    while True:
        status = cluster_status(args.address, credentials=credentials)
        text = json.dumps(status, indent=1, default=str) if args.json else render(status)
        if args.once or args.json:
            print(text, flush=True)
            return
        print("\033[2J\033[H" + time.strftime("%H:%M:%S ") + text, flush=True)  # clear the screen, redraw
        time.sleep(args.interval)


def _inspect(args) -> None:
    from ..wire.server import refusal
    from .inspection import inspect_server
    credentials = _credentials(args)
    import pyarrow.flight as fl
    try:
        inspect_server(args.address, rows=args.rows, credentials=credentials)
    except fl.FlightError as exc:  # refused, unreachable: say so, without a client-side traceback
        raise SystemExit(f"error: {args.address}: {type(exc).__name__}: {refusal(exc)}") from None


def _probe(args) -> None:
    """Exit 0 when the role at the address answers within ``--timeout``, else 1 (``probe.liveness``)."""
    from .probe import liveness
    try:
        alive, line = liveness(args.address, args.timeout, _credentials(args))
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if not alive:
        raise SystemExit(line)
    print(line)


def _mix(args) -> None:
    from .. import wire
    from ..wire.actions import MixRequest
    from ..wire.server import connect, refusal
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in args.set.split(","))):
        name, _, value = item.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            raise SystemExit(f"error: mix --set: {item!r} is not NAME=WEIGHT (a number)") from None
    client = connect(args.address, _credentials(args))
    try:
        answer = wire.call(client, "mix", MixRequest(weights, args.at, args.only, args.dry_run).to_wire())
    except Exception as exc:  # noqa: BLE001 - refused or invalid: the server's message, no traceback
        raise SystemExit(f"error: mix: {refusal(exc)}") from None
    finally:
        client.close()
    from ..planner.edits import format_weights
    before = "the dynamic schedule's" if answer["before"] is None else format_weights(answer["before"])
    lead = "from step" if answer["applied"] else "dry run, nothing changed; from step"
    print(f"{lead} {answer['step']}: {format_weights(answer['weights'])}\n"
          f"until then: {before}\n(a weight is relative: a source's share is its weight over the sum)")


def _skip(args) -> None:
    from .. import wire
    from ..core.skips import parse_window
    from ..wire.actions import SkipRequest
    from ..wire.server import connect
    try:
        first, last = parse_window(args.steps, "skip --steps")
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    client = connect(args.address, _credentials(args))
    try:
        answer = wire.call(client, "skip", SkipRequest(first, last).to_wire())
    except Exception as exc:  # noqa: BLE001 - refused or invalid: the server's message, no traceback
        raise SystemExit(f"error: skip: {str(exc).split('. Detail:')[0]}") from None
    finally:
        client.close()
    said = "set" if answer["added"] else "was set already"
    print(f"steps {first}-{last} ({said}): the samples they would have had are dropped; from step {first} on the steps "
          f"hold the samples after them; `overlord audit` counts the dropped ones as skipped")


def _audit(args) -> None:
    from ..planner.audit import dumps, offline_audit, render
    target = args.target
    try:
        if "://" in target:
            from .. import wire
            from ..wire.server import connect
            client = connect(target, _credentials(args))
            try:
                report = wire.call(client, "audit", {}, timeout=600)
            finally:
                client.close()
        else:
            report = offline_audit(Path(target), args.config)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: audit: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a Flight error: the server's message, no traceback
        from ..wire.server import refusal
        raise SystemExit(f"error: audit: {refusal(exc)}") from None
    print(dumps(report) if args.json else render(report), flush=True)


def _convert(args) -> None:
    from ..formats.convert import convert_files
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    files = convert_files(args.inputs, args.out, columns=columns, row_group_bytes=args.row_group_bytes,
                          row_groups_per_file=args.row_groups_per_file, progress=not args.quiet)
    print(f"wrote {len(files)} Parquet file(s) to {Path(args.out).resolve()}", flush=True)


def _certs(args) -> None:
    from .certs import config_snippet, make_certs
    files = make_certs(args.dir, hosts=tuple(args.host), days=args.days)
    print(f"wrote {', '.join(sorted(files))} to {Path(args.dir).resolve()}")
    print(config_snippet(files), end="")


def main(argv: list[str] | None = None) -> None:
    # Before pyarrow loads (a role process loads it with its role's module, in _serve): every role and the
    # processes it starts. Here, not at import: a process that only imports this module keeps its environment.
    allocator.system_pool_for_this_process_tree()
    command_line, argv = argv is None, sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    parser = argparse.ArgumentParser(prog="overlord", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="start every role locally, supervised; print the Planner's address")
    p.add_argument("config")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue the run in the config's run_dir from its "
                       "latest checkpoint (trainers continue with TrainerClient.load_state_dict)")
    start.add_argument("--fresh", action="store_true", help="start over: move a previous run in run_dir aside")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local: one supervised process per role; ray: the roles as Ray actors (pip install "
                   "flight_overlord[ray])")
    p.add_argument("--address", help="with --backend ray: join this Ray cluster (auto, or HOST:PORT); default: "
                   "start a local Ray with this machine's CPUs")
    p.set_defaults(func=_up)
    p = sub.add_parser("serve", help="run one role: planner | loader | constructor (for manual deployment); "
                       "node: every role of a 'deployment: single_node' run in this process")
    p.add_argument("role", choices=ROLES)
    p.add_argument("flags", nargs=argparse.REMAINDER, help="the role's flags: overlord serve ROLE --help")
    p.set_defaults(func=_serve)
    p = sub.add_parser("partition", help="profile every source, journal the profile in run_dir/partition/ and "
                       "plan the loader actors per source and their hosts within a CPU and memory budget")
    p.add_argument("config")
    p.add_argument("--cpus", type=float, help="CPUs for the loader hosts (default: loader.budget.cpus, else this "
                   "machine's)")
    p.add_argument("--memory", type=float, metavar="GiB", help="memory for the loader hosts (default: "
                   "loader.budget.memory_gib, else half this machine's RAM)")
    p.add_argument("--reprofile", action="store_true", help="measure again even if run_dir holds a valid profile")
    p.set_defaults(func=_partition)
    p = sub.add_parser("make-demo-data", help="write the demo corpus as Parquet")
    p.add_argument("dir", nargs="?", help="a folder, or a pyarrow.fs URI such as "
                   "s3://bucket/demo?endpoint_override=... (credentials from the environment); "
                   f"default: ./{DEFAULT_DATA_DIR}, where `overlord demo` reads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--sources", type=int, default=None, metavar="N",
                   help="instead of the demo corpus: N text sources src000.. cycling over the six demo "
                        "generators, each its own size (from --seed) and rows")
    p.add_argument("--rows-per-source", type=int, default=None,
                   help="with --sources: median rows per source (each source x 1/4..4; default 2000); "
                        "with --navit: rows per source (default 200); with --coyo: rows per source (default 2000)")
    p.add_argument("--navit", type=int, nargs="?", const=306, default=None, metavar="N",
                   help="instead of the demo corpus: N image-text sources navit000.. (default 306), each with "
                        "its own image count, resolution and caption length distributions (demo/navit.py)")
    p.add_argument("--coyo", action="store_true",
                   help="instead of the demo corpus: 5 image-caption sources coyo0..coyo4 (demo/navit.py)")
    p.add_argument("--long-tail", type=int, default=None, metavar="MAX_TOKENS",
                   help="instead of the demo corpus: one long-tail text source longtail_<K>k (most samples "
                        "short, a few up to MAX_TOKENS byte tokens; synthetic text, see demo/long_tail.py)")
    p.add_argument("--long-tail-rows", type=int, default=20000, help="with --long-tail: rows (default 20000)")
    p.set_defaults(func=_make_demo_data)
    p = sub.add_parser("demo", help="bring the system up and run one simulated trainer per rank (makes the demo data "
                       "the config needs if missing; moves a previous demo run in its run_dir aside)")
    p.add_argument("--config", help="default: the shipped demo config (configs/demo.yaml) over --data, into --run-dir")
    p.add_argument("--data", help=f"the shipped config's data_root, made if missing (default: ./{DEFAULT_DATA_DIR})")
    p.add_argument("--run-dir",
                   help=f"the shipped config's run_dir, logs and config copy (default: ./{DEFAULT_RUN_DIR})")
    p.add_argument("--steps", type=int, default=None)
    p.set_defaults(func=_demo)
    p = sub.add_parser("inspect", help="show what a Flight server offers, with the stock Flight API only")
    p.add_argument("address")
    p.add_argument("--rows", type=int, default=2)
    _add_credential_args(p)
    p.set_defaults(func=_inspect)
    p = sub.add_parser("status", help="a live view of a running deployment: every role up or down, progress, "
                       "buffers, bytes (through the Planner's address)")
    p.add_argument("address", help="the Planner's address")
    p.add_argument("--once", action="store_true", help="print once and exit")
    p.add_argument("--json", action="store_true", help="print the status as JSON once (for machines)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    _add_credential_args(p)
    p.set_defaults(func=_status)
    p = sub.add_parser("probe", help="liveness probe: exit 0 when the role at ADDRESS answers within --timeout, "
                       "else 1 (for a Kubernetes exec probe or a Slurm health check)")
    p.add_argument("address", help="any role's address (grpc://HOST:PORT)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer (default 5)")
    _add_credential_args(p)
    p.set_defaults(func=_probe)
    p = sub.add_parser("mix", help="reweight the sources of a running run from a future step on (journaled; "
                       "needs the run's cluster secret: --config)")
    p.add_argument("address", help="the Planner's address")
    p.add_argument("--set", required=True, metavar="NAME=W,...", help="the new weights of the sources named; "
                   "the others keep the weight they have at that step (see --only)")
    p.add_argument("--at", type=int, help="the first step under the new weights (default: the first not planned yet)")
    p.add_argument("--only", action="store_true", help="sources not named in --set weigh 0 from that step on")
    p.add_argument("--dry-run", action="store_true", help="print the weights that would be in force, change nothing")
    _add_credential_args(p)
    p.set_defaults(func=_mix)
    p = sub.add_parser("skip", help="drop the samples a window of future steps would have had (after a loss "
                       "spike); the steps from its first on hold the samples after them (journaled; --config)")
    p.add_argument("address", help="the Planner's address")
    p.add_argument("--steps", required=True, metavar="FIRST:LAST", help="the steps, both included, not planned yet "
                   "(for steps planned already: stop, add `skip: [\"FIRST:LAST\"]` to the config, resume)")
    _add_credential_args(p)
    p.set_defaults(func=_skip)
    p = sub.add_parser("audit", help="what a run delivered, from its journals: samples, duplicates, missing, "
                       "per source, across every resume and mixture edit")
    p.add_argument("target", help="a run_dir (a stopped run) or the Planner's address (a running one)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _add_credential_args(p)
    p.set_defaults(func=_audit)
    p = sub.add_parser("convert", help="JSON Lines (.jsonl, .gz, .bz2, .zst), WebDataset tar shards and MDS datasets "
                       "into Parquet with row groups sized for the loader (a source's files)")
    p.add_argument("inputs", nargs="+", help="JSON Lines files, WebDataset shards (.tar, .tar.gz) or MDS folders "
                   "(index.json and its shards), converted in the order given")
    p.add_argument("--out", required=True, help="an empty folder for part-NNNNN.parquet")
    p.add_argument("--columns", help="keep only these fields (comma-separated)")
    p.add_argument("--row-group-bytes", type=int, default=1 << 20, help="Arrow bytes per row group (default 1 MiB)")
    p.add_argument("--row-groups-per-file", type=int, default=64, help="row groups per Parquet file (default 64)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_convert)
    p = sub.add_parser("certs", help="make a development CA and server/client certificates for TLS and mutual TLS")
    p.add_argument("dir")
    p.add_argument("--host", action="append", default=[], help="another name or IP for the server certificate "
                   "(127.0.0.1 and localhost are always in it); repeatable")
    p.add_argument("--days", type=int, default=365)
    p.set_defaults(func=_certs)
    args = parser.parse_args(argv)
    args.command_line = command_line  # this process is the command's own (not a caller's): it may exec itself
    if args.command in QUERIES:  # their answer is the output: a reader wants no progress lines beside it
        logging.getLogger().setLevel(logging.WARNING)
    try:
        args.func(args)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
