"""TrainerPositions: where the Planner believes each rank is, from the ranks' asks, their constructors'
reports and constructor restarts, and where a replica group that lost its state rejoins."""
from flight_overlord.core.mesh import Mesh
from flight_overlord.core.positions import TrainerPositions


def test_an_ask_is_the_trainers_word_even_behind_a_report():
    p = TrainerPositions()
    p.asked(0, 0)
    assert p.reported({0: 7}) and p.requested[0] == 7
    assert not p.reported({0: 6})  # reports never move a rank back
    p.asked(0, 5)  # the stream broke; steps 5, 6 never reached the trainer
    assert p.requested[0] == 5 and p.slowest() == 5


def test_a_restarted_constructors_reported_ranks_are_stale_until_they_ask_again():
    p = TrainerPositions()
    p.asked(0, 0)
    p.asked(1, 4)  # asked, never reported (one step at a time): its word stands, never stale
    p.reported({0: 9})
    p.constructor_restarted([0, 1])
    assert not p.settled([0, 1]) and p.settled([1])
    assert not p.reported({0: 12}) and p.requested[0] == 9  # no report moves a stale rank
    p.asked(0, 8)
    assert p.settled([0, 1]) and p.requested == {0: 8, 1: 4} and p.slowest() == 4


def test_a_report_says_whether_the_slowest_moved_or_a_rank_is_new():
    p = TrainerPositions()
    assert p.reported({0: 3, 1: 3})  # new ranks
    assert p.reported({0: 5, 1: 4}) and p.slowest() == 4  # the slowest moved
    assert not p.reported({0: 6}) and p.requested[0] == 6  # moved, ahead of the slowest: nobody to wake
    assert p.reported({2: 9})  # a rank new here, though ahead
    assert p.reported({1: 7}) and p.slowest() == 6


def test_no_rank_yet():
    assert TrainerPositions().slowest() == -1


def test_a_replica_group_rejoins_at_its_earliest_rank_counting_what_its_constructor_served():
    p = TrainerPositions()
    for rank in range(4):
        p.asked(rank, 0)
    p.reported({0: 6, 1: 6, 2: 9, 3: 9})
    assert p.rejoin_step((0, 1), {}) == 6
    # the constructor sent further than it reported (reports ride on plan requests, which run ahead)
    assert p.rejoin_step((0, 1), {0: 10, 1: 8}) == 9  # the group starts together: at its earliest rank
    assert p.rejoin_step((2, 3), {2: 3}) == 9  # a served step behind the position never moves it back


def test_a_group_never_heard_of_rejoins_where_the_slowest_rank_is():
    p = TrainerPositions()
    assert p.rejoin_step((0,), {}) == 0  # a fresh run
    p.asked(1, 4)
    p.asked(2, 7)
    assert p.rejoin_step((0,), {}) == 4


def test_a_replica_group_is_the_ranks_of_one_data_parallel_index():
    mesh = Mesh(dp=2, tp=2)  # Megatron order: tp varies fastest
    assert mesh.replica_group(0) == mesh.replica_group(1) == (0, 1)
    assert mesh.replica_group(3) == (2, 3)
