"""The Planner's action bodies, typed: what one end writes the other reads back unchanged, and a
malformed body is a ValueError naming the action and the field."""
from __future__ import annotations

import pyarrow.flight as fl
import pytest

from flight_overlord import wire
from flight_overlord.wire.actions import (
    PlanRequest,
    PositionRequest,
    PositionsReport,
    Report,
    ResumePointRequest,
    StatsRequest,
    plans_message,
)
from flight_overlord.wire.plan_channel import PLANS, action_answer, check_descriptor


@pytest.mark.parametrize("message", [
    PlanRequest(3, 1, {"0": 3, "1": 4}), PlanRequest(0, 0), PlanRequest(2, 1, {}, 1.0), ResumePointRequest(2),
    Report(5, 1, losses={"qa": 1.5}, waits={"data": 0.1}), Report(5, 0, compute_seconds=[0.1, 0.2]),
    Report(2, 3, encoder_seconds=0.5), StatsRequest(4, 9), StatsRequest(), PositionRequest(3),
    PositionsReport(1, {"2": 7})])
def test_what_one_end_writes_the_other_reads(message):
    raw = wire.decode(wire.encode(message.to_wire()), "body")  # through JSON, as on the wire
    assert type(message).from_wire(raw) == message


def test_the_wire_format_stays_what_stock_clients_send():
    assert StatsRequest(4, 9).to_wire() == {"from": 4, "to": 9} and StatsRequest().to_wire() == {"from": 0}
    assert Report(5, 1, losses={"qa": 1.0}).to_wire() == {"step": 5, "rank": 1, "losses": {"qa": 1.0}}
    assert StatsRequest.from_wire({}) == StatsRequest(0, None)


@pytest.mark.parametrize("cls,raw,message", [
    (PlanRequest, {"constructor": 0}, "malformed plan: missing field 'step'"),
    (PlanRequest, {"step": 1, "constructor": True}, "malformed plan: field 'constructor' must be an integer"),
    (PlanRequest, {"step": 1, "constructor": 0, "positions": [1]}, "malformed plan: field 'positions' must be dict"),
    (PlanRequest, {"step": 1, "constructor": 0, "wait": 0}, "malformed plan: field 'wait' must be a positive number"),
    (PlanRequest, {"step": 1, "constructor": 0, "wait": "1"}, "malformed plan: field 'wait' must be a positive number"),
    (ResumePointRequest, {"constructor": "0"}, "malformed resume_point: field 'constructor' must be an integer"),
    (PositionRequest, {}, "malformed position: missing field 'rank'"),
    (Report, {"step": 1, "rank": 0}, "malformed report: give 'losses'"),
    (Report, {"step": 1, "rank": 0, "losses": [1.0]}, "malformed report: field 'losses' must be dict"),
    (StatsRequest, {"from": "a"}, "malformed stats: field 'from' must be an integer"),
    (PositionsReport, {"constructor": 0}, "malformed positions report: missing field 'positions'")])
def test_a_malformed_body_names_the_action_and_the_field(cls, raw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        cls.from_wire(raw)


def test_a_plans_message_is_a_plan_request_when_it_names_a_step_and_the_action_answers_as_the_stream():
    from flight_overlord.wire.plan import ConstructorPlan, EncodedPlan
    assert plans_message({"step": 2, "constructor": 1}) == PlanRequest(2, 1)
    assert plans_message({"constructor": 1, "positions": {"0": 3}}) == PositionsReport(1, {"0": 3})
    with pytest.raises(ValueError, match="malformed positions report: missing field 'constructor'"):
        plans_message({"positions": {}})
    plans = [ConstructorPlan(s, "DP", [], 8, [], [], {0: [[]]}, []) for s in (4, 5)]
    assert action_answer([EncodedPlan.of(p) for p in plans]) == plans[0].to_wire()  # the asked step's constructor plan
    assert action_answer({"ok": True}) == {"ok": True}


def test_the_plans_stream_has_one_descriptor_and_names_what_is_wrong():
    check_descriptor(fl.FlightDescriptor.for_path(PLANS))
    for bad in (fl.FlightDescriptor.for_path("plan"), fl.FlightDescriptor.for_path(PLANS, "0"),
                fl.FlightDescriptor.for_command(b"plans")):
        with pytest.raises(KeyError, match="unknown do_exchange descriptor"):
            check_descriptor(bad)


def test_an_encoded_plan_on_the_plans_stream_is_the_constructor_plan_field_by_field():
    """A constructor plan as the plans stream carries it (an encoded_plan record batch and a JSON header,
    through IPC as on the wire) is the ConstructorPlan it was made from, also with encoder rows, HDP extras
    and a sample fetched by two constructors; a plan that fetches a sample twice is refused."""
    import pyarrow as pa

    from flight_overlord.wire.plan import ConstructorPlan, EncodedPlan, FetchGroup, encoded_plan_schema
    plan = ConstructorPlan(7, "DP", ["tp"], 64, ["a:f:0:1", "b:g:1:0", "a:f:0:4"], [10, 64, 3],
                           {2: [[1, 0], [2]], 3: [[], [0]]},
                           [FetchGroup("b", 0, ["grpc://h:1"], [1], [[0, "g", 1, 0, 2]]),
                            FetchGroup("a", 1, ["grpc://h:2", "grpc://h:3"], [0, 2],
                                       [[1, "f", 0, 1, 1], [1, "f", 0, 4, 1]])],
                           "DP", {2: [[1, 0, 3, 1]]}, {"hdp": {"2": [[[1, 0]]]}})
    encoded = EncodedPlan.of(plan)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, encoded_plan_schema()) as writer:
        writer.write_batch(encoded.rows)
    rows = pa.ipc.open_stream(sink.getvalue()).read_next_batch()
    assert EncodedPlan(encoded.header, rows).plan() == plan
    assert encoded.to_wire() == plan.to_wire()
    twice = ConstructorPlan(0, "DP", [], 8, ["k"], [1], {0: [[0]]},
                            [FetchGroup("a", 0, [], [0], [[0, "f", 0, 0, 1]])] * 2)
    with pytest.raises(ValueError, match="does not fetch every sample exactly once"):
        EncodedPlan.of(twice)
    # a row in a group the header lacks
    strays = rows.set_column(2, encoded_plan_schema().field("group"), pa.array([0, 1, 2], pa.int32()))
    with pytest.raises(ValueError, match="fetch groups outside 0..1"):
        EncodedPlan(encoded.header, strays).plan()


def test_microbatches_numbered_in_row_order_travel_as_their_sizes():
    """A constructor plan whose microbatches list its samples 0, 1, 2, ... in order (every one made from a
    step plan's columns) carries their sizes in its header, not index lists, and reads back the same plan; one in
    another order keeps its lists; sizes that name more samples than the rows hold are refused."""
    from flight_overlord.wire import decode, encode
    from flight_overlord.wire.plan import ConstructorPlan, EncodedPlan, FetchGroup

    def plan_of(microbatches):
        keys = [f"a:f:0:{i}" for i in range(4)]
        return ConstructorPlan(3, "DP", [], 64, keys, [5, 6, 7, 8], microbatches,
                               [FetchGroup("a", 0, ["grpc://h:1"], list(range(4)),
                                           [[0, "f", 0, i, 1] for i in range(4)])])

    in_order = plan_of({4: [[0, 1], []], 5: [[2], [3]]})
    encoded = EncodedPlan.of(in_order)
    header = decode(encoded.header, "header")
    assert header["bins"] == [[4, [2, 0]], [5, [1, 1]]] and "microbatches" not in header
    assert encoded.plan() == in_order and encoded.to_wire() == in_order.to_wire()
    shuffled = plan_of({4: [[1, 0], []], 5: [[2], [3]]})
    assert "bins" not in decode(EncodedPlan.of(shuffled).header, "header")
    assert EncodedPlan.of(shuffled).plan() == shuffled
    with pytest.raises(ValueError, match="bins hold 5 samples, its rows only 4"):
        EncodedPlan(encode({**header, "bins": [[4, [2, 3]]]}), encoded.rows).plan()
    for bad in ([[4, [2, -1]]], [[4, [True]]], [{"4": [2]}], [[4, 2]]):
        with pytest.raises(ValueError, match="bins must be"):
            EncodedPlan(encode({**header, "bins": bad}), encoded.rows).plan()


def test_constructor_plans_of_consecutive_steps_travel_as_one_answer():
    """The plans stream's answer: constructor plans of consecutive steps, rows back to back in one batch (through IPC
    as on the wire), read back as the same plans in order; a header whose row counts do not cover the
    rows is refused, naming it."""
    import pyarrow as pa

    from flight_overlord.wire import decode, encode
    from flight_overlord.wire.plan import (
        ConstructorPlan,
        EncodedPlan,
        FetchGroup,
        answer_message,
        encoded_plan_schema,
        read_answer_message,
    )

    def plan_of(step, n):
        keys = [f"a:f:{step}:{i}" for i in range(n)]
        return ConstructorPlan(step, "DP", [], 64, keys, list(range(1, n + 1)), {0: [list(range(n))]},
                               [FetchGroup("a", 0, ["grpc://h:1"], list(range(n)),
                                           [[0, "f", step, i, 1] for i in range(n)])])

    plans = [plan_of(5, 3), plan_of(6, 0), plan_of(7, 2)]
    header, rows = answer_message([EncodedPlan.of(p) for p in plans])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, encoded_plan_schema()) as writer:
        writer.write_batch(rows)
    rows = pa.ipc.open_stream(sink.getvalue()).read_next_batch()
    assert rows.num_rows == 5 and read_answer_message(header, rows) == plans
    assert read_answer_message(*answer_message([EncodedPlan.of(plans[0])])) == plans[:1]
    for bad in ({"rows": [3, 0, 1]}, {"rows": [3, True, 1]}, {"views": [1, 2, 3]}):
        with pytest.raises(ValueError, match="covering its 5 rows"):
            read_answer_message(encode({**decode(header, "header"), **bad}), rows)
