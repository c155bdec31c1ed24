"""Property-based fuzzing of reply validation and aggregation, for every registered method.

Each example takes a round of valid replies (the shapes the strategy asks for, from the server
benchmark's reply builder), damages one of them in a randomly drawn way, and sends the round
through ``aggregate_train``. It must never raise, must report the damaged reply in ``dropped``,
and must leave the server in exactly the state that the other replies alone produce.
The fast suite draws ``FUZZ_EXAMPLES`` (default 150) damaged replies per method, enough to try every
kind of damage on every method; ``make test-long`` draws 1,000.
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.app.error import Error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes import fake_clients, fake_reply
from fedcore import wire
from fedcore.config import Config
from fedcore.models import model_facts
from fedcore.registry import REGISTRY
from tests.conftest import SMALL_CREFF, SMALL_MUPFL

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
LONG_EXAMPLES = 1000
CLIENTS = 4
METRIC_MUTATIONS = ("error", "no-metrics", "drop-metric", "bad-pid", "bad-count", "nan-metric")
ARRAY_MUTATIONS = ("drop-record", "drop-array", "reshape", "nan-value", "huge", "garbage", "truncate", "retype")


def _equal(a, b) -> bool:
    """Structural equality of strategy state (dicts, lists, arrays, tensors, modules, scalars)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if hasattr(a, "detach"):
        return bool((a.detach() == b.detach()).all()) if a.shape == b.shape else False
    if hasattr(a, "state_dict"):
        return _equal(a.state_dict(), b.state_dict())
    return a == b


class Round:
    """One method's round-1 setting: a strategy (pickled, so each example starts fresh), its train
    messages, valid replies, and the state reached without each client's reply."""

    def __init__(self, method: str):
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        # MuPFL's server matches 100 features per class for 100 steps at its defaults (2 s a round);
        # validation and aggregation are the same at a small PKCF
        small = {"mupfl": SMALL_MUPFL, "creff": SMALL_CREFF}.get(method, {})
        # every client trains (MuPFL's and FedMCSA's paper settings sample a fifth of them)
        cfg = Config.from_run_config({"method": method, "dataset": "digits", "fraction-train": 1.0, **small})
        strategy = REGISTRY[method].strategy(cfg, fake_clients(CLIENTS), model_facts(cfg["model"], (1, 8, 8), 10, 0))
        rng = np.random.default_rng(0)
        prepare = strategy.configure_prepare(None)
        if prepare:
            strategy.aggregate_prepare_replies([fake_reply(strategy, m, "prepare", rng) for m in prepare])
        self.template = pickle.dumps(strategy)
        fresh = self.fresh()
        self.msgs = list(fresh.configure_train(1, ArrayRecord(), ConfigRecord(), None))
        self.replies = [fake_reply(fresh, m, "train", rng) for m in self.msgs]
        self.expected = {}
        for skip in range(len(self.replies)):
            s = self.fresh()
            s.configure_train(1, ArrayRecord(), ConfigRecord(), None)
            s.aggregate_train(1, [r for i, r in enumerate(self.replies) if i != skip])
            self.expected[skip] = s.state_dict()["method"]

    def fresh(self):
        return pickle.loads(self.template)

    def schema(self, index: int) -> dict:
        strategy = self.fresh()
        return strategy.reply_schema(strategy.pid_of[self.msgs[index].metadata.dst_node_id])


_ROUNDS: dict[str, Round] = {}


def _round(method: str) -> Round:
    if method not in _ROUNDS:
        _ROUNDS[method] = Round(method)
    return _ROUNDS[method]


def _arrays(content: RecordDict) -> list[tuple[str, str]]:
    return [(name, key) for name, rec in content.items() if isinstance(rec, ArrayRecord) for key in wire.unpack_arrays(rec)]


def _is_packed(rec: ArrayRecord) -> bool:
    return wire.PACKED_KEY in rec and rec[wire.PACKED_KEY].stype == wire.PACKED_STYPE


def _with_array(content: RecordDict, name: str, key: str, array=None, raw: Array | None = None,
                drop: bool = False) -> dict:
    """``content`` with array ``key`` of record ``name`` replaced (or dropped), in the record's own
    layout; ``raw`` replaces the bytes themselves (of the one packed Array, for a packed record)."""
    out = dict(content)
    rec = content[name]
    if _is_packed(rec):
        if raw is not None:
            out[name] = ArrayRecord({wire.PACKED_KEY: raw})
        else:
            views = dict(wire.unpack_arrays(rec))
            if drop:
                views.pop(key)
            else:
                views[key] = array
            out[name] = wire.pack_arrays(views)
        return out
    out[name] = ArrayRecord({k: (raw if raw is not None else Array(np.ascontiguousarray(array))) if k == key else rec[k]
                             for k in rec.keys() if not (drop and k == key)})
    return out


def _required_kind(schema: dict, name: str, key: str) -> str | None:
    """The dtype kind the strategy requires of an array, if it requires one."""
    from fedstrategies.base import ArraySpec

    spec = schema.get(name, {}).get(key)
    if isinstance(spec, ArraySpec) and spec.kind is not None:
        return spec.kind
    if name == wire.CLASS_FEATURES and key in ("class-ids", "counts"):
        return "i"
    return None


def damage(reply: Message, msg: Message, mutation: str, draw, schema: dict) -> Message | None:
    """``reply`` damaged by ``mutation``; None when the mutation does not apply to this reply."""
    content = reply.content
    metrics = dict(content[wire.METRICS])
    arrays = _arrays(content)
    floats = [(n, k) for n, k in arrays if wire.unpack_arrays(content[n])[k].dtype.kind == "f"]
    rest = {k: v for k, v in content.items() if k != wire.METRICS}
    if mutation == "error":
        return Message(Error(code=0, reason="fuzzed"), reply_to=msg)
    if mutation == "no-metrics":
        return Message(RecordDict(rest), reply_to=msg)
    if mutation in ("drop-metric", "bad-pid", "bad-count", "nan-metric"):
        if mutation == "drop-metric":
            metrics.pop(draw(st.sampled_from([wire.PARTITION_ID, wire.NUM_EXAMPLES])))
        elif mutation == "bad-pid":
            metrics[wire.PARTITION_ID] = draw(st.sampled_from([metrics[wire.PARTITION_ID] + 1, -1, 10 ** 6, 0.5]))
        elif mutation == "bad-count":
            metrics[wire.NUM_EXAMPLES] = draw(st.sampled_from([-1, 2.5, 10 ** 9, float("inf")]))
        else:
            metrics[draw(st.sampled_from([wire.TRAIN_LOSS, wire.NUM_EXAMPLES]))] = float("nan")
        return Message(RecordDict({**rest, wire.METRICS: MetricRecord(metrics)}), reply_to=msg)
    if not arrays:
        return None
    name, key = draw(st.sampled_from(arrays))
    view = wire.unpack_arrays(content[name])[key]
    if mutation == "drop-record":
        rest.pop(name)
        new = rest
    elif mutation == "drop-array":
        new = _with_array(content, name, key, drop=True)
    elif mutation == "reshape":
        extra = draw(st.integers(1, 3))
        new = _with_array(content, name, key, np.zeros(view.size + extra, view.dtype).reshape(-1, 1)
                          if view.ndim != 2 else np.zeros((view.shape[0] + extra, view.shape[1]), view.dtype))
    elif mutation in ("nan-value", "huge"):
        if not floats:
            return None
        name, key = draw(st.sampled_from(floats))
        view = wire.unpack_arrays(content[name])[key]
        if view.size == 0:
            return None
        bad = np.array(view)
        if mutation == "nan-value":
            bad.flat[draw(st.integers(0, bad.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        else:
            bad = bad * np.float32(1e25) + np.float32(1e25)
        new = _with_array(content, name, key, bad)
    elif mutation in ("garbage", "truncate"):
        packed = _is_packed(content[name])
        data = content[name][wire.PACKED_KEY if packed else key].data
        if mutation == "garbage":
            data = draw(st.binary(min_size=0, max_size=200))
        else:
            data = data[:-draw(st.integers(1, max(1, min(64, len(data) - 1))))]
        raw = (Array(dtype="uint8", shape=(len(data),), stype=wire.PACKED_STYPE, data=data) if packed else
               Array(dtype=content[name][key].dtype, shape=tuple(view.shape), stype="numpy.ndarray", data=data))
        new = _with_array(content, name, key, raw=raw)
    else:  # retype: an array whose dtype the strategy requires arrives as another kind, same shape
        kind = _required_kind(schema, name, key)
        if kind is None or view.size == 0:
            return None
        swapped = view.astype(np.int64) if kind == "f" else view.astype(np.float32) + np.float32(0.5)
        new = _with_array(content, name, key, swapped)
    new = {k: v for k, v in new.items() if k != wire.METRICS}
    return Message(RecordDict({**new, wire.METRICS: content[wire.METRICS]}), reply_to=msg)


@pytest.mark.parametrize("method", sorted(REGISTRY))
def test_malformed_replies_never_crash_the_server_nor_change_its_state(method):
    _fuzz(method, EXAMPLES)


@pytest.mark.long
@pytest.mark.parametrize("method", sorted(REGISTRY))
def test_a_thousand_malformed_replies_per_method(method):
    _fuzz(method, LONG_EXAMPLES)


def _fuzz(method: str, examples: int) -> None:
    base = _round(method)
    if not base.replies:
        pytest.skip(f"{method} sends no train messages")
    seen = {"damaged": 0, "tried": 0, "kinds": set()}

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data):
        victim = data.draw(st.integers(0, len(base.replies) - 1))
        has_arrays = bool(_arrays(base.replies[victim].content))
        mutation = data.draw(st.sampled_from(METRIC_MUTATIONS + (ARRAY_MUTATIONS if has_arrays else ())))
        seen["tried"] += 1
        seen["kinds"].add(mutation)
        bad = damage(base.replies[victim], base.msgs[victim], mutation, data.draw, base.schema(victim))
        if bad is None:
            return
        strategy = base.fresh()
        strategy.configure_train(1, ArrayRecord(), ConfigRecord(), None)
        before = len(strategy.dropped)
        replies = list(base.replies)
        replies[victim] = bad
        strategy.aggregate_train(1, replies)
        dropped = strategy.dropped[before:]
        assert len(dropped) == 1 and dropped[0]["client"] in (victim, f"node {bad.metadata.src_node_id}"), \
            (mutation, dropped)
        assert _equal(strategy.state_dict()["method"], base.expected[victim]), mutation
        seen["damaged"] += 1

    check()
    # Most draws really damaged a reply. Hypothesis stops early once it has tried every distinct draw (small
    # search spaces, as for methods whose replies carry no arrays), so compare with the draws it made.
    assert seen["damaged"] >= 0.5 * seen["tried"] and seen["damaged"] >= min(50, examples), seen
    # every kind of damage that applies to this method's replies was drawn at least once
    kinds = METRIC_MUTATIONS + (ARRAY_MUTATIONS if any(_arrays(r.content) for r in base.replies) else ())
    assert set(kinds) <= seen["kinds"], sorted(set(kinds) - seen["kinds"])
