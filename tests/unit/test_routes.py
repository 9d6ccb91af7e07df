"""``planner/routes.py``: where the Planner's calls to loaders go: a row group's metadata request names
its owner (and a resharded source's segments), and a reshard goes to every replica of the source's
actors once per process."""
from __future__ import annotations

from flight_overlord.config import parse_config
from flight_overlord.core.order import RowGroupRef
from flight_overlord.planner.routes import LoaderRoutes
from flight_overlord.planner.scaling import SourceScaling


def _routes(tmp_path, scaling: bool) -> LoaderRoutes:
    (tmp_path / "f.parquet").write_bytes(b"")  # the config only checks that the file exists
    cfg = parse_config({"run_dir": str(tmp_path / "run"), "data_root": str(tmp_path), "mesh": {"dp": 1},
                        "loader": {"shadows": 1},
                        "sources": [{"name": "a", "paths": "f.parquet", "loaders": 2},
                                    {"name": "b", "paths": "f.parquet"}],
                        "global_batch": {"context_length": 64, "microbatches": 1, "samples_per_step": 4}},
                       base_dir=tmp_path)
    routes = LoaderRoutes.of(cfg, 1)
    if scaling:
        routes.scaling = SourceScaling(cfg)
    groups = [["f.parquet", g, 10] for g in range(4)]
    routes.roster.register_loader("a", 0, 0, "grpc://h:1", groups[:2])
    routes.roster.register_loader("a", 0, 1, "grpc://h:2", groups[:2])  # a shadow of actor 0
    routes.roster.register_loader("a", 1, 0, "grpc://h:1", groups[2:])  # one process, two actors
    routes.roster.register_loader("b", 0, 0, "grpc://h:3", groups)
    return routes


def test_a_metadata_request_names_the_owner_and_where_it_is_served(tmp_path):
    routes = _routes(tmp_path, scaling=False)
    request, actor = routes.metadata_request("a", 1, RowGroupRef("f.parquet", 3, 10))
    assert actor == ("a", 1) and (request.source, request.actor, request.epoch, request.row_group) == ("a", 1, 1, 3)
    assert request.segments is None
    assert routes.locations(("a", 0)) == ["grpc://h:1", "grpc://h:2"]


def test_a_reshard_goes_to_every_process_of_the_source_once(tmp_path):
    routes = _routes(tmp_path, scaling=True)
    routes.scaling.segments["a"] = [[0, 1], [40, 2]]
    sends = routes.reshards([{"source": "a"}])
    assert sorted(location for location, _ in sends) == ["grpc://h:1", "grpc://h:2"]
    assert {r.to_wire()["segments"] == [[0, 1], [40, 2]] and r.source == "a" for _, r in sends} == {True}
    request, _ = routes.metadata_request("a", 0, RowGroupRef("f.parquet", 0, 10))
    assert request.segments == ((0, 1), (40, 2))
