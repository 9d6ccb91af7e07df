"""TrainerClient as a well-kept iterator, against a real cluster: one prefetch thread for the
client's life, a second ``iter()`` continues where the last stopped, ``state_dict()`` between steps,
``close()`` joins the thread."""
from __future__ import annotations

import threading
import time

import pytest

from flight_overlord.client import TrainerClient
from flight_overlord.deploy.launch import LocalCluster

from ..helpers import delivered_keys, write_config

STEPS = 8


def _steps(tables) -> list[int]:
    return [t.column("step")[0].as_py() for t in tables]


def test_a_second_iteration_continues_in_order_and_close_joins_the_thread(corpus, tmp_path):
    with LocalCluster(write_config(tmp_path, corpus)) as cluster:
        other = threading.Thread(target=lambda: list(TrainerClient(cluster.planner, 1, num_steps=STEPS,
                                                                   as_tensors=False, timeout=60)))
        other.start()
        client = TrainerClient(cluster.planner, 0, num_steps=STEPS, as_tensors=False, timeout=60)
        seen, states = [], []
        for table in client:  # an epoch loop that stops early, as framework wrappers do
            seen.append(table)
            states.append(client.state_dict())
            if len(seen) == 3:
                break
        time.sleep(1.0)  # the prefetch thread runs ahead meanwhile; it must not be doubled by the next iter()
        for table in client:
            seen.append(table)
            states.append(client.state_dict())
        assert list(client) == []  # exhausted: a third loop yields nothing, it does not start over
        thread = client._thread
        client.close()
        assert not thread.is_alive()
        with pytest.raises(RuntimeError, match="closed"):
            next(client)
        other.join(timeout=60)
    assert _steps(seen) == list(range(STEPS))
    assert states == [{"rank": 0, "next_step": s + 1} for s in range(STEPS)]
    keys = delivered_keys(seen)
    assert len(keys) == len(set(keys)) > 0


def test_close_mid_stream_joins_the_prefetch_thread_and_a_new_client_resumes_from_the_state(corpus, tmp_path):
    with LocalCluster(write_config(tmp_path, corpus)) as cluster:
        def rank1():
            with TrainerClient(cluster.planner, 1, num_steps=STEPS, as_tensors=False, timeout=60) as client:
                list(client)
        other = threading.Thread(target=rank1)
        other.start()
        first = TrainerClient(cluster.planner, 0, as_tensors=False, timeout=60)  # no end: prefetches ahead
        head = [next(first), next(first)]
        state = first.state_dict()
        thread = first._thread
        first.close()
        assert not thread.is_alive()
        with pytest.raises(RuntimeError, match="before iterating"):
            first.load_state_dict(state)
        second = TrainerClient(cluster.planner, 0, num_steps=STEPS - 2, as_tensors=False, timeout=60)
        second.load_state_dict(state)
        with second:
            tail = list(second)
        other.join(timeout=60)
    assert state == {"rank": 0, "next_step": 2}
    assert _steps(head + tail) == list(range(STEPS))


def test_from_env_takes_the_launchers_rank_and_checks_its_world_size(idle_cluster):
    env = {"RANK": "1", "WORLD_SIZE": "2", "OVERLORD_PLANNER": idle_cluster.planner}
    with TrainerClient.from_env(env=env, timeout=30) as client:
        assert client.rank == 1
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}
    with pytest.raises(ValueError, match="started 4 ranks but the run .* has a mesh of 2 ranks"):
        TrainerClient.from_env(idle_cluster.planner, env=slurm, timeout=30)
    with pytest.raises(ValueError, match="OVERLORD_PLANNER"):
        TrainerClient.from_env(env={"RANK": "0", "WORLD_SIZE": "2"})


def test_tensors_are_placed_on_the_device_asked_for(idle_cluster):
    with TrainerClient(idle_cluster.planner, 0, num_steps=1, device="meta", timeout=30) as client:
        (batch,) = list(client)
    assert batch and all(mb["input_ids"].device.type == "meta" and mb["cu_seqlens"].device.type == "meta"
                         for mb in batch)
    assert isinstance(batch[0]["sample_keys"], list)
