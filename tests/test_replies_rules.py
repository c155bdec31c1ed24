"""The rules of reply validation (fedstrategies/replies.py), each checked on its own: every check of a reply's
metrics, records and arrays drops the reply with its reason; a reply from a client not asked, a duplicate and a
missing reply are counted; kept replies come in partition-id order; the norm bound takes the round's lower median
or the state's reference, whichever is larger; a client back without its state is noted."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.app.error import Error

from fedcore import wire
from fedstrategies.base import ClientInfo
from fedstrategies.replies import ArraySpec, ClientReply, ReplyValidation, _nonfinite

NODE = 100  # client pid's node is NODE + pid
SCHEMA = {"w": {"a": (2, 2), "b": ArraySpec((3,), "i")}}


class Server(ReplyValidation):
    """The hooks and state ``ReplyValidation`` reads, as ``PersonalizedStrategy`` holds them."""

    def __init__(self, bound: float = 0.0, reference: float | None = None, check=None, num_val: int = 0):
        counts = np.array([6, 4])
        self.clients = {pid: ClientInfo(pid, NODE + pid, 10, 5, counts, counts // 2, num_val) for pid in range(4)}
        self.pid_of = {NODE + pid: pid for pid in self.clients}
        self.cfg = {"reply-norm-bound": bound}
        self._pending: dict[str, set[int]] = {}
        self.dropped, self.state_lost, self._state_round = [], [], {}
        self._reference, self._check, self.checked = reference, check, []

    def check_reply(self, reply):
        self.checked.append(reply.pid)
        return self._check(reply) if self._check else None

    def reference_norm(self, record):
        return self._reference.get(record) if isinstance(self._reference, dict) else self._reference

    def run(self, phase: str, replies, schema=None, required=(), asked=None, server_round: int = 1):
        """``schema``: one for every client, or a function of the partition id."""
        self._pending[phase] = set(range(4)) if asked is None else set(asked)
        schema_of = schema if callable(schema) else lambda pid: SCHEMA if schema is None else schema
        return self.validate(server_round, phase, replies, schema_of, required)


@pytest.fixture(autouse=True)
def _task_identity():
    """Flower's Message needs a run, node and task id."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


def _arrays(scale: float = 1.0, **override) -> dict:
    return {"w": wire.pack_arrays({"a": np.full((2, 2), scale, np.float32), "b": np.arange(3), **override})}


def reply(pid: int, metrics: dict | None = None, records: dict | None = None, node: int | None = None,
          drop: tuple[str, ...] = ()) -> Message:
    asked = Message(RecordDict(), dst_node_id=NODE + pid if node is None else node, message_type="train")
    m = {wire.PARTITION_ID: pid, wire.NUM_EXAMPLES: 10, **(metrics or {})}
    m = {k: v for k, v in m.items() if k not in drop}
    return Message(RecordDict({**(_arrays() if records is None else records), wire.METRICS: MetricRecord(m)}),
                   reply_to=asked)


def _reason(server: Server, phase: str, msg: Message, **kw) -> str:
    kept = server.run(phase, [msg], asked=[server.pid_of.get(msg.metadata.src_node_id, 0)], **kw)
    assert kept == [], "the reply was kept"
    reasons = [d["reason"] for d in server.dropped if "no reply" not in d["reason"]]
    assert len(reasons) == 1, server.dropped
    return reasons[0]


def test_a_well_formed_reply_is_kept_with_its_arrays_weight_and_norm():
    s = Server()
    [got] = s.run("train", [reply(1, {"m.acc": 0.5, "m.words": [1.0, 2.0], "train-loss": 1.0})], asked=[1])
    assert s.dropped == [] and (got.pid, got.node_id, got.num_examples, got.phase) == (1, NODE + 1, 10, "train")
    assert np.array_equal(got.arrays["w"]["a"], np.ones((2, 2))) and np.array_equal(got.arrays["w"]["b"], [0, 1, 2])
    assert got.norms == {"w": pytest.approx(2.0)}  # sqrt of the float arrays' squares; the int array is left out
    assert got.method_metrics() == {"acc": 0.5}  # the m.* scalars, prefix stripped
    assert s.checked == [1]


def test_an_array_given_as_none_in_the_schema_may_have_any_shape_and_numeric_kind():
    s = Server()
    [got] = s.run("train", [reply(0, records={"w": wire.pack_arrays({"a": np.ones(7, np.float64)})})],
                  schema={"w": {"a": None}}, asked=[0])
    assert got.arrays["w"]["a"].shape == (7,) and got.norms == {"w": pytest.approx(math.sqrt(7))}
    [got] = Server().run("train", [reply(0, records={"w": wire.pack_arrays({"a": np.ones(2, bool)})})],
                         schema={"w": {"a": (2,)}}, asked=[0])
    assert got.norms == {}


@pytest.mark.parametrize("metrics,drop,reason", [
    ({}, (wire.PARTITION_ID,), f"missing metric {wire.PARTITION_ID!r}"),
    ({}, (wire.NUM_EXAMPLES,), f"missing metric {wire.NUM_EXAMPLES!r}"),
    ({"x": float("nan")}, (), "non-finite metric 'x'"),
    ({"x": [1.0, float("inf")]}, (), "non-finite metric 'x'"),
    ({wire.NUM_EXAMPLES: 2.5}, (), f"metric {wire.NUM_EXAMPLES!r} must be an integer, got 2.5"),
    ({wire.NUM_EXAMPLES: [3]}, (), f"metric {wire.NUM_EXAMPLES!r} must be an integer, got [3]"),
    ({wire.PARTITION_ID: 2}, (), f"partition id 2 does not match node {NODE + 1} (expected 1)"),
    ({wire.NUM_EXAMPLES: 11}, (), "num-examples 11 is outside 0..10"),
    ({wire.NUM_EXAMPLES: -1}, (), "num-examples -1 is outside 0..10"),
    ({wire.CORRECT: 11}, (), "correct = 11 is outside 0..10"),
    ({wire.CORRECT: -1}, (), "correct = -1 is outside 0..10"),
])
def test_a_bad_metric_drops_the_reply_with_its_reason(metrics, drop, reason):
    assert _reason(Server(), "train", reply(1, metrics, drop=drop)).startswith(reason)


def test_required_metrics_and_the_test_split_bound_an_evaluation():
    evaluate = {"required": (wire.CORRECT,), "schema": {}}
    assert _reason(Server(), "evaluate", reply(1, {}, {}), **evaluate) == f"missing metric {wire.CORRECT!r}"
    assert _reason(Server(), "evaluate", reply(1, {wire.CORRECT: 1}, {}), **evaluate).startswith(
        "num-examples 10 is outside 0..5")  # an evaluation is bounded by the test split, not the training set
    ok = {wire.NUM_EXAMPLES: 5, wire.CORRECT: 5}
    assert [r.pid for r in Server().run("evaluate", [reply(1, ok, {})], asked=[1], **evaluate)] == [1]
    edge = {wire.NUM_EXAMPLES: 0, wire.CORRECT: 0}
    assert [r.pid for r in Server().run("evaluate", [reply(1, edge, {})], asked=[1], **evaluate)] == [1]


VAL_OK = {wire.NUM_EXAMPLES: 5, wire.CORRECT: 3, wire.VAL_NUM_EXAMPLES: 4, wire.VAL_CORRECT: 4, wire.VAL_LOSS: 0.5}


@pytest.mark.parametrize("metrics,drop,reason", [
    ({}, (wire.VAL_NUM_EXAMPLES,), f"missing metric {wire.VAL_NUM_EXAMPLES!r}"),
    ({}, (wire.VAL_CORRECT,), f"missing metric {wire.VAL_CORRECT!r}"),
    ({}, (wire.VAL_LOSS,), f"missing metric {wire.VAL_LOSS!r}"),
    ({wire.VAL_NUM_EXAMPLES: 5}, (), f"{wire.VAL_NUM_EXAMPLES} 5 is outside 0..4"),
    ({wire.VAL_NUM_EXAMPLES: -1}, (), f"{wire.VAL_NUM_EXAMPLES} -1 is outside 0..4"),
    ({wire.VAL_CORRECT: 5}, (), f"{wire.VAL_CORRECT} = 5 is outside 0..4"),
    ({wire.VAL_CORRECT: -1}, (), f"{wire.VAL_CORRECT} = -1 is outside 0..4"),
    ({wire.VAL_CORRECT: 1.5}, (), f"metric {wire.VAL_CORRECT!r} must be an integer, got 1.5"),
])
def test_a_client_with_a_validation_split_must_score_it_within_its_size(metrics, drop, reason):
    msg = reply(1, {**VAL_OK, **metrics}, {}, drop=drop)
    assert _reason(Server(num_val=4), "evaluate", msg, required=(wire.CORRECT,), schema={}).startswith(reason)


def test_an_empty_validation_score_is_a_score_and_one_validation_sample_is_a_split():
    empty = {**VAL_OK, wire.VAL_NUM_EXAMPLES: 0, wire.VAL_CORRECT: 0}
    assert len(Server(num_val=4).run("evaluate", [reply(1, empty, {})], {}, (wire.CORRECT,), asked=[1])) == 1
    msg = reply(1, {wire.NUM_EXAMPLES: 5, wire.CORRECT: 3}, {})  # no validation score at all
    assert _reason(Server(num_val=1), "evaluate", msg, required=(wire.CORRECT,), schema={}) == \
        f"missing metric {wire.VAL_NUM_EXAMPLES!r}"


def test_validation_metrics_are_checked_when_sent_though_no_split_was_declared():
    msg = reply(1, {wire.NUM_EXAMPLES: 5, wire.CORRECT: 1, wire.VAL_NUM_EXAMPLES: 0}, {})
    assert _reason(Server(), "evaluate", msg, required=(wire.CORRECT,), schema={}) == \
        f"missing metric {wire.VAL_CORRECT!r}"
    [kept] = Server(num_val=4).run("evaluate", [reply(1, VAL_OK, {})], {}, (wire.CORRECT,), asked=[1])
    assert kept.metrics[wire.VAL_CORRECT] == 4
    # training replies carry no evaluation, so a declared validation split asks nothing of them
    assert [r.pid for r in Server(num_val=4).run("train", [reply(1)], asked=[1])] == [1]


def test_a_reply_without_its_metrics_record_is_dropped():
    asked = Message(RecordDict(), dst_node_id=NODE + 1, message_type="train")
    assert _reason(Server(), "train", Message(RecordDict(_arrays()), reply_to=asked)) == "missing metrics record"


def test_each_client_is_held_to_its_own_schema():
    schemas = {0: {"w": {"a": (2, 2)}}, 1: {"w": {"a": (4,)}}}
    kept = Server().run("train", [reply(0), reply(1, records={"w": wire.pack_arrays({"a": np.ones(4)})})],
                        schema=schemas.get, asked=[0, 1])
    assert [r.pid for r in kept] == [0, 1]


def test_the_norm_of_a_record_is_over_all_its_float_arrays():
    record = {"w": wire.pack_arrays({"a": np.full(4, 1.0), "c": np.full(5, 2.0, np.float32), "i": np.arange(9)})}
    [got] = Server().run("train", [reply(0, records=record)], schema={"w": {"a": None, "c": None, "i": None}},
                         asked=[0])
    assert got.norms == {"w": pytest.approx(math.sqrt(4 + 5 * 4))}


def _packed_junk() -> ArrayRecord:
    return ArrayRecord({wire.PACKED_KEY: Array(dtype="|u1", shape=(4,), stype=wire.PACKED_STYPE, data=b"junk")})


@pytest.mark.parametrize("records,reason", [
    ({}, "missing array record 'w'"),
    ({"w": MetricRecord({"a": 1.0})}, "missing array record 'w'"),
    ({"w": _packed_junk()}, "record 'w' cannot be read"),
    ({"w": wire.pack_arrays({"a": np.ones((2, 2), np.float32)})}, "record 'w' lacks array 'b'"),
    (_arrays(a=np.ones((4,), np.float32)), "w/a has shape (4,), expected (2, 2)"),
    (_arrays(b=np.ones((3,), np.float32)), "w/b has dtype float32, expected kind 'i'"),
    (_arrays(b=np.ones((3,), np.uint8)), "w/b has dtype uint8, expected kind 'i'"),
    (_arrays(a=np.ones((2, 2), np.complex64)), "w/a has dtype complex64, not a number"),
    (_arrays(a=np.array([[1.0, np.nan], [0.0, 0.0]], np.float32)), "w/a contains NaN or Inf"),
    (_arrays(a=np.array([[1.0, -np.inf], [0.0, 0.0]], np.float32)), "w/a contains NaN or Inf"),
    (_arrays(a=np.full((2, 2), 3e38, np.float32)), "w/a holds values so large that its norm overflows"),
])
def test_a_bad_record_or_array_drops_the_reply_with_its_reason(records, reason):
    assert _reason(Server(), "train", reply(1, records=records)).startswith(reason)


def test_the_finiteness_check_reads_every_element_and_sums_the_squares():
    assert _nonfinite(np.zeros((0, 3), np.float32)) == (None, 0.0)
    assert _nonfinite(np.array([[3.0], [4.0]])) == (None, 25.0)
    assert _nonfinite(np.array([np.nan]))[0] == "contains NaN or Inf"  # one element is checked like many
    assert _nonfinite(np.array([[-3.0]])) == (None, 9.0)
    problem, _ = _nonfinite(np.array([0.0, 0.0, np.nan]))
    assert problem == "contains NaN or Inf"


def test_a_client_error_a_stranger_a_duplicate_and_a_silent_client_are_each_counted():
    s = Server()
    error = Message(Error(code=0, reason="boom"), reply_to=Message(RecordDict(), dst_node_id=NODE + 2,
                                                                   message_type="train"))
    kept = s.run("train", [reply(3), reply(1), reply(1), error, reply(0, node=999)], asked=[1, 2, 3])
    assert [r.pid for r in kept] == [1, 3]  # in partition-id order, whatever the arrival order
    assert [(d["client"], d["reason"]) for d in s.dropped] == [
        (1, "duplicate reply"),
        (2, "client error: boom"),
        ("node 999", "partition id 0 does not match node 999 (expected None)"),
    ]
    s = Server()
    s.run("train", [reply(0), reply(1)], asked=[1, 2], server_round=4)
    assert [(d["round"], d["phase"], d["client"], d["reason"]) for d in s.dropped] == [
        (4, "train", 0, "unexpected reply (client 0 was not asked this round)"),
        (4, "train", 2, "no reply (timed out or node gone)"),
    ]


def test_method_checks_judge_train_replies_only_and_their_reason_drops_the_reply():
    s = Server(check=lambda r: "too odd" if r.pid % 2 else None)
    assert [r.pid for r in s.run("train", [reply(0), reply(1)], asked=[0, 1])] == [0]
    assert s.dropped[0]["reason"] == "too odd" and s.checked == [0, 1]
    s = Server(check=lambda r: "too odd")
    metrics = {wire.NUM_EXAMPLES: 5, wire.CORRECT: 1}
    assert len(s.run("evaluate", [reply(0, metrics, {}), reply(1, metrics, {})], {}, (wire.CORRECT,))) == 2
    assert s.checked == []


def _norm_round(scales, bound, reference=None, phase="train"):
    s = Server(bound=bound, reference=reference)
    kept = s.run(phase, [reply(pid, records=_arrays(scale)) for pid, scale in enumerate(scales)],
                 asked=range(len(scales)))
    return [r.pid for r in kept], s.dropped


def test_the_norm_bound_drops_replies_beyond_bound_times_the_rounds_lower_median():
    # norms are 2 x scale; the lower median of (2, 2, 200, 202) is 2, so 10 x 2 = 20 drops both hostile replies
    kept, dropped = _norm_round([1.0, 1.0, 100.0, 101.0], bound=10.0)
    assert kept == [0, 1] and [d["client"] for d in dropped] == [2, 3]
    assert dropped[0]["reason"].startswith("w has norm 200, beyond 10 x 2 (the round's median 2, the server "
                                           "state's 0); see reply-norm-bound")
    assert (dropped[0]["round"], dropped[0]["phase"]) == (1, "train")
    # of three norms (2, 20, 200) the median is the middle one: 5 x 20 drops only 200
    assert _norm_round([1.0, 10.0, 100.0], bound=5.0)[0] == [0, 1]
    assert _norm_round([0.01, 0.01, 10.0], bound=10.0)[0] == [0, 1]  # small norms are bounded too
    assert _norm_round([1.0, 1.5], bound=1.0)[0] == [0]  # a bound of 1 is a bound: the median itself
    assert _norm_round([1.0, 10.0], bound=10.0)[0] == [0, 1]  # a norm of exactly bound x scale is kept
    assert _norm_round([1.0, 10.01], bound=10.0)[0] == [0]


def test_the_norm_bound_takes_the_states_reference_when_larger_and_is_off_at_zero_or_in_evaluation():
    assert _norm_round([50.0, 1.0], bound=10.0, reference=None)[0] == [1]
    assert _norm_round([50.0, 1.0], bound=10.0, reference=50.0)[0] == [0, 1]  # the reference raises the scale
    assert _norm_round([1.0, 1.0, 1.0], bound=10.0, reference=0.01)[0] == [0, 1, 2]  # ...and never lowers it
    assert _norm_round([50.0], bound=10.0)[0] == [0]  # a lone reply is its own median
    assert _norm_round([50.0, 1.0], bound=10.0, reference={"w": 50.0, "x": 1.0})[0] == [0, 1]  # its record's
    assert _norm_round([50.0, 1.0], bound=0.0)[0] == [0, 1]
    assert _norm_round([0.0, 0.0, 5.0], bound=10.0)[0] == [0, 1, 2]  # a zero median and no reference: no scale
    s = Server(bound=10.0)
    metrics = {wire.NUM_EXAMPLES: 5, wire.CORRECT: 1}
    kept = s.run("evaluate", [reply(0, metrics, _arrays(50.0)), reply(1, metrics, _arrays(1.0))],
                 required=(wire.CORRECT,), asked=[0, 1])
    assert [r.pid for r in kept] == [0, 1]


def _record(name: str, scale: float) -> ArrayRecord:
    return wire.pack_arrays({name: np.full(4, scale, np.float32)})


def test_each_record_is_bounded_on_its_own_over_the_replies_that_carry_it():
    """Client 0 alone carries record b and is dropped on record a: b has no norms left, and record c, after it,
    is still bounded (client 3's), though clients 0 and 3 never carry c and a."""
    schemas = {0: {"a": {"a": None}, "b": {"b": None}}, 1: {"a": {"a": None}, "c": {"c": None}},
               2: {"a": {"a": None}, "c": {"c": None}}, 3: {"c": {"c": None}}}
    records = {0: {"a": _record("a", 5.0), "b": _record("b", 0.01)},
               1: {"a": _record("a", 0.01), "c": _record("c", 0.01)},
               2: {"a": _record("a", 0.01), "c": _record("c", 0.01)}, 3: {"c": _record("c", 5.0)}}
    s = Server(bound=10.0)
    kept = s.run("train", [reply(pid, records=records[pid]) for pid in range(4)], schema=schemas.get)
    assert [r.pid for r in kept] == [1, 2] and [d["client"] for d in s.dropped] == [0, 3]


def test_a_record_of_zero_norms_leaves_the_next_records_bounded():
    schema = {"a": {"a": None}, "b": {"b": None}}
    records = [{"a": _record("a", 0.0), "b": _record("b", b)} for b in (1.0, 1.0, 100.0)]
    assert [r.pid for r in Server(bound=10.0).run("train", [reply(p, records=r) for p, r in enumerate(records)],
                                                  schema=schema, asked=range(3))] == [0, 1]


def test_replies_of_a_phase_nobody_was_asked_in_are_unexpected():
    s = Server()
    assert s.validate(1, "prepare", [reply(0)], lambda pid: SCHEMA) == []
    assert [d["reason"] for d in s.dropped] == ["unexpected reply (client 0 was not asked this round)"]


def test_a_client_back_without_the_state_it_saved_is_noted_and_goes_on():
    s = Server()
    saved = {wire.STATE_SAVED: 1, wire.STATE_ROUND: 0}
    s.run("train", [reply(0, saved), reply(1)], asked=[0, 1], server_round=2)
    assert s._state_round == {0: 2} and s.state_lost == []
    s.run("train", [reply(0, {wire.STATE_ROUND: 2}), reply(1, {wire.STATE_ROUND: 0})], asked=[0, 1], server_round=3)
    assert s.state_lost == []  # it has the state of round 2; client 1 never saved any
    kept = s.run("train", [reply(0, {wire.STATE_ROUND: 1})], asked=[0], server_round=5)
    assert [r.pid for r in kept] == [0]
    assert s.state_lost == [{"round": 5, "phase": "train", "client": 0, "had": 2, "got": 1}]
    s.run("train", [reply(0)], asked=[0], server_round=6)
    assert s.state_lost[-1] == {"round": 6, "phase": "train", "client": 0, "had": 2, "got": 0}
    s = Server()
    s.run("train", [reply(0, saved)], asked=[0], server_round=1)  # state saved in round 1 counts too
    s.run("train", [reply(0, {wire.STATE_ROUND: 0}), reply(1, {wire.STATE_ROUND: -1})], asked=[0, 1], server_round=2)
    assert [(x["client"], x["had"]) for x in s.state_lost] == [(0, 1)]  # client 1 never had state to lose


def test_method_metrics_are_the_numeric_m_scalars_without_their_prefix():
    r = ClientReply(0, NODE, 1, {"m.a": 1, "m.b": 0.5, "m.c": [1.0], "x.m.d": 2.0, "e": 3.0})
    assert r.method_metrics() == {"a": 1, "b": 0.5}
