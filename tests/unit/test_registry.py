"""One behaviour for every registry (core/registry.py): balancers, cost models, transforms and
context-parallel splits, all registered through flight_overlord.orchestration."""
from __future__ import annotations

import pytest

from flight_overlord import orchestration as o
from flight_overlord import transforms
from flight_overlord.core import balance, context_parallel, cost

REGISTRIES = {  # register function, its registry, a known name, a new entry
    "balancer": (o.register_balancer, balance._BALANCERS, "greedy", lambda problem, items: None),
    "cost model": (o.register_cost_model, cost.COST_MODELS, "tokens", lambda: None),
    "transform": (o.register_transform, transforms.TRANSFORMS, "byte_tokenizer", lambda: None),
    "context-parallel split": (lambda name: lambda split: o.register_cp_split(name, split),
                               context_parallel.CP_SPLITS, "contiguous", o.CPSplit(1, lambda cp, rank: [rank])),
}


@pytest.fixture
def restored():
    before = {what: dict(registry) for what, (_, registry, _, _) in REGISTRIES.items()}
    yield
    for what, (_, registry, _, _) in REGISTRIES.items():
        registry.clear()
        registry.update(before[what])


@pytest.mark.parametrize("what", REGISTRIES)
def test_a_taken_name_is_an_error_naming_both_entries(what, restored):
    register, registry, known, entry = REGISTRIES[what]
    with pytest.raises(ValueError, match=f"{what} '{known}' is already registered .*cannot register"):
        register(known)(entry)
    assert registry[known] is not entry


@pytest.mark.parametrize("what", REGISTRIES)
def test_an_unknown_name_lists_the_known_ones(what):
    _, registry, known, _ = REGISTRIES[what]
    with pytest.raises(o.UnknownName, match=f"unknown {what} 'nope' \\(registered: .*{known}") as err:
        registry["nope"]
    assert isinstance(err.value, ValueError) and isinstance(err.value, KeyError)
    assert str(err.value).startswith("unknown")  # the plain message, not KeyError's quoted repr


@pytest.mark.parametrize("what", REGISTRIES)
def test_a_registered_entry_is_found_by_name(what, restored):
    register, registry, _, entry = REGISTRIES[what]
    assert register("mine")(entry) is entry
    assert registry["mine"] is entry and registry.names()[-1] == "mine"


def test_a_name_must_be_a_non_empty_string():
    with pytest.raises(TypeError, match="cost model name must be a non-empty string"):
        o.register_cost_model("")
