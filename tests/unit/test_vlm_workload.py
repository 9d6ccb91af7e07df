"""benchmarks.training.vlm_workload (``benchmarks.training.end_to_end --workload``): the samples it
draws are the corpus generator's, cut as the loader cuts them; the Planner's hybrid placement reaches the floor no plan
can beat and is never slower than Vanilla on the same draws."""
from __future__ import annotations

import numpy as np
import pytest

from flight_overlord.core.vision import num_patches, patch_grid


@pytest.fixture(scope="module")
def vw():
    from benchmarks.training import vlm_workload
    return vlm_workload


def test_draws_are_deterministic_and_cut_like_the_loader(vw):
    stream, again = (vw.SampleStream("navit", 4096, seed=5, sources=20) for _ in range(2))
    drawn = [stream.draw() for _ in range(400)]
    assert drawn == [again.draw() for _ in range(400)]
    assert drawn != [vw.SampleStream("navit", 4096, seed=6, sources=20).draw() for _ in range(400)]
    merge = stream.spec.merge_size ** 2
    for d in drawn:
        assert 1 <= d.tokens <= 4096
        assert sum(p // merge + 2 for p in d.image_patches) < d.tokens  # every kept image's run whole inside
    assert max(d.tokens for d in drawn) == 4096  # some samples are cut to the context
    assert len({d.source for d in drawn}) == 20


def test_coyo_draws_are_single_image_captions(vw):
    stream = vw.SampleStream("coyo", 4096, seed=0)
    drawn = [stream.draw() for _ in range(200)]
    assert all(len(d.image_patches) == 1 for d in drawn)
    assert {d.source for d in drawn} == set(range(5))
    grid = patch_grid(1000, 800, stream.spec)
    assert num_patches(grid) <= stream.spec.max_pixels // 16 ** 2


@pytest.mark.parametrize("microbatches", [1, 4])
def test_hybrid_reaches_its_floor_and_beats_vanilla(vw, tmp_path, microbatches):
    common = dict(workload="navit", ranks=16, context=8192, microbatches=microbatches, steps=3, fill=0.9,
                  seed=1, sources=40, workdir=tmp_path)
    vanilla = vw.simulate(scenario="vanilla", **common)
    hybrid = vw.simulate(scenario="hybrid", **common)
    assert hybrid["over_floor"] < 1.05  # within 5 % of what no placement of the samples can beat
    assert vanilla["over_floor"] > hybrid["over_floor"]
    assert hybrid["tokens_per_s"] > vanilla["tokens_per_s"]


def test_cost_ceiling_is_the_worst_token_over_the_cheapest(vw):
    llm, vit = vw.LLM_12B, vw.VIT_2B
    most = 28 * 28 * 1280 // 14 ** 2
    assert vw.cost_ceiling("navit", 16384) == pytest.approx(
        (llm.a + llm.b * 16384 + 4 * (vit.a + vit.b * most)) / llm.a)
    assert vw.cost_ceiling("navit", 4096) < vw.cost_ceiling("navit", 16384)
    assert np.isfinite(vw.cost_ceiling("coyo", 8192))
