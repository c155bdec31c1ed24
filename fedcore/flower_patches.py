"""Every change this project makes to Flower's private internals, in one module, applied only where asked.

The fast runtime (``RUNTIME=fast``, ``--runtime fast``, the launcher's default; ``PFL_RUNTIME`` in the
processes it starts) takes out waits that Flower 1.41 hard-codes and offers no setting for:

* ``object_pulls``: message objects asked for before they are all there are retried after 10 ms, not after
  Flower's first back-off of 1 s (``inflatable_utils`` pull functions' keyword defaults);
* ``supernode_sleep``: the SuperNode's 3 s idle poll and 0.5 s reply waits (``start_client_internal.time``);
* ``fab_install``: an installed FAB is not unpacked and hash-checked again for every ClientApp
  (``run_clientapp.install_from_fab``);
* ``superexec``: ClientApps forked from a pre-imported SuperExec and its fixed task poll replaced
  (``run_superexec.get_executor`` and ``run_superexec.time``);
* ``kick``: the simulation engine's message mover woken when the ServerApp has pushed messages, instead of
  at its next 0.1 s poll (the stop event of ``vce_api.add_messages_to_queue``).

One is a fix, applied in every simulation (fast or stock runtime), since it changes nothing while all Ray
actors live: ``dead_actors`` keeps an actor that died (its Ray node was lost) out of the simulation's actor
pool, where Flower put it back to fail every later client sent to it (``BasicActorPool``).

Two make the simulation's cost per message independent of the number of nodes (docs/scale.md), also in every
simulation, since they change what is looked at, never what is delivered: ``indexed_message_ins`` gives the
engine's message mover an index of undelivered messages by node (Flower scanned every stored message for each
node, on every pass: N x M checks a pass), and ``replied`` tells the ServerApp's pull loop which of its messages
have a reply, so that it asks Flower only for those (Flower checked every outstanding message on every pull).

Each patch first checks the installed Flower version and the signature of what it replaces, and refuses
with ``FlowerMismatch`` (naming what differs and the way out: the stock runtime) rather than change an
internal it does not know; ``check_all`` runs every check without patching (``tests/test_flower_patches.py``
fails when an upgraded Flower no longer matches). Results are the stock runtime's: the patches change
when waits end, never what is computed (tests compare runs of both).
"""

from __future__ import annotations

import inspect
import os
import threading
import time
from importlib.metadata import version

SCALE_ENV = "PFL_SCALE_PATCHES"  # "off": the simulation runs Flower's own message mover and pulls (benchmarks)
RUNTIME_ENV = "PFL_RUNTIME"  # "fast" in the processes of a fast-runtime run (set by runner/), else stock Flower
FAST, STOCK = "fast", "flower"
SUPPORTED_FLOWER = ("1.41.",)  # the versions whose internals these patches were written against

_PULL_DEFAULTS = {"initial_backoff", "backoff_cap", "max_tries_per_object"}
_SIGNATURES = {  # the parameters of what is replaced or wrapped, as Flower 1.41 has them
    "install_from_fab": ["fab_file", "install_dir", "skip_prompt"],
    "get_executor": ["executor_type", "executor_config", "insecure", "root_certificates_path"],
    "add_messages_to_queue": ["state", "queue", "nodes_mapping", "f_stop"],
    "submit": ["self", "actor_fn", "job"],
    "add_actor_back_to_pool": ["self", "future"],
    "fetch_result_and_return_actor_to_pool": ["self", "future"],
    "get_message_ins": ["self", "node_id", "limit", "run_id"],
    "store_message_ins": ["self", "message"],
    "_check_stored_messages": ["self", "message_ids", "run_id"],
}
_STATE_ATTRIBUTES = ("lock", "message_ins_store", "message_ins_id_to_message_res_id")


class FlowerMismatch(RuntimeError):
    """The installed Flower is not the one a patch was written for: the patch is refused."""


def asked() -> bool:
    """Whether this process belongs to a fast-runtime run (``PFL_RUNTIME=fast``)."""
    return os.environ.get(RUNTIME_ENV, STOCK) == FAST


def scale_asked() -> bool:
    """Whether this simulation indexes messages and pulls only replies (all do, unless ``PFL_SCALE_PATCHES=off``,
    which ``benchmarks.scale_round`` sets for its rows of Flower's own path)."""
    return os.environ.get(SCALE_ENV, "on") != "off"


def _refuse(what: str) -> None:
    raise FlowerMismatch(f"{what} (installed Flower {version('flwr')}; these patches were written for "
                         f"{', '.join(v + 'x' for v in SUPPORTED_FLOWER)}): run with Flower's stock runtime "
                         "(RUNTIME=flower, --runtime flower) or update fedcore/flower_patches.py")


def check_version() -> None:
    if not version("flwr").startswith(SUPPORTED_FLOWER):
        _refuse("Flower's internals may differ")


def _check_signature(fn, name: str) -> None:
    params = list(inspect.signature(fn).parameters)
    if params != _SIGNATURES[name]:
        _refuse(f"{name} takes {params}, not {_SIGNATURES[name]}")


def _check_time_module(module, where: str) -> None:
    if getattr(module, "time", None) is not time and not _is_stand_in(getattr(module, "time", None)):
        _refuse(f"{where} no longer sleeps through a module-level `time`")


def _is_stand_in(obj) -> bool:
    return getattr(obj, "_pfl_time_stand_in", False)


def check_object_pulls() -> list:
    check_version()
    from flwr.supercore.inflatable import inflatable_utils

    fns = [inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree]
    for fn in fns:
        if not _PULL_DEFAULTS <= set(fn.__kwdefaults__ or {}):
            _refuse(f"{fn.__name__} has no keyword defaults {sorted(_PULL_DEFAULTS)}")
    return fns


def check_supernode_sleep():
    check_version()
    from flwr.supernode import start_client_internal

    _check_time_module(start_client_internal, "the SuperNode loop (start_client_internal)")
    return start_client_internal


def check_fab_install():
    check_version()
    from flwr.supernode.runtime import run_clientapp

    install = getattr(run_clientapp.install_from_fab, "__wrapped__", run_clientapp.install_from_fab)
    _check_signature(install, "install_from_fab")
    return run_clientapp


def check_superexec():
    check_version()
    from flwr.supercore.superexec import run_superexec

    _check_signature(getattr(run_superexec.get_executor, "__wrapped__", run_superexec.get_executor), "get_executor")
    _check_time_module(run_superexec, "the SuperExec loop (run_superexec)")
    return run_superexec


def check_message_mover(target=None) -> None:
    check_version()
    if target is None:
        from flwr.server.superlink.fleet.vce.vce_api import add_messages_to_queue as target
    _check_signature(target, "add_messages_to_queue")


def check_actor_pool():
    check_version()
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    for name in ("submit", "add_actor_back_to_pool", "fetch_result_and_return_actor_to_pool"):
        fn = getattr(BasicActorPool, name)
        _check_signature(getattr(fn, "__wrapped__", fn), name)
    return BasicActorPool


def check_link_state(state=None):
    """Flower's in-memory LinkState as the index patches know it; ``state`` (an instance) must be one."""
    check_version()
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    for name in ("get_message_ins", "store_message_ins", "_check_stored_messages"):
        fn = getattr(InMemoryLinkState, name)
        _check_signature(getattr(fn, "__wrapped__", fn), name)
    if state is not None:
        if not isinstance(state, InMemoryLinkState):
            _refuse(f"the simulation's LinkState is a {type(state).__name__}, not an InMemoryLinkState")
        missing = [a for a in _STATE_ATTRIBUTES if not hasattr(state, a)]
        if missing:
            _refuse(f"InMemoryLinkState has no {missing}")
    return InMemoryLinkState


def check_all() -> None:
    """Every patch's check, nothing patched: raises FlowerMismatch when the installed Flower differs."""
    check_link_state()
    check_actor_pool()
    check_object_pulls()
    check_supernode_sleep()
    check_fab_install()
    check_superexec()
    check_message_mover()


# ---------------------------------------------------------------- the patches
def object_pulls(cap: float) -> None:
    """Retry unavailable message objects after 10 ms, doubling up to ``cap``, instead of Flower's 1 s
    doubling up to 10 s; the total wait is still bounded by Flower's own ``max_time`` (2 h)."""
    for fn in check_object_pulls():
        fn.__kwdefaults__.update(initial_backoff=0.01, backoff_cap=cap, max_tries_per_object=None)


def supernode_sleep(stand_in) -> None:
    """The SuperNode loop sleeps through ``stand_in`` (an object with the ``time`` module's API)."""
    check_supernode_sleep().time = _mark(stand_in)


def fab_install(wrap) -> None:
    """``run_clientapp.install_from_fab`` becomes ``wrap(install_from_fab)``."""
    module = check_fab_install()
    wrapped = wrap(module.install_from_fab)
    wrapped.__wrapped__ = module.install_from_fab
    module.install_from_fab = wrapped


def superexec(wrap_executor, stand_in) -> None:
    """The SuperExec's executors become ``wrap_executor(executor)`` and its loop sleeps through ``stand_in``."""
    module = check_superexec()
    flower_get_executor = module.get_executor

    def get_executor(*args, **kwargs):
        return wrap_executor(flower_get_executor(*args, **kwargs))

    get_executor.__wrapped__ = flower_get_executor
    module.get_executor = get_executor
    module.time = _mark(stand_in)


def _mark(stand_in):
    try:
        stand_in._pfl_time_stand_in = True
    except AttributeError:
        pass
    return stand_in


# ---------------------------------------------------------------- waking the simulation engine
# Flower 1.41's simulation engine runs in the ServerApp's process. One thread (``add_messages_to_queue``) moves
# new messages from the LinkState to the workers' queue, then sleeps ``f_stop.wait(0.1)``: every phase of every
# round started 0 to 0.1 s after the ServerApp sent it (5% of a 20-client mnist5k round). A second extracting
# thread is no option: ``get_message_ins`` marks messages delivered outside the state's lock. ``kick`` replaces
# the ``wait`` of that thread's stop event (a plain ``threading.Event`` only it waits on) by a wait on a wake-up
# event with the same timeout, and sets the wake-up event; the loop still polls every 0.1 s on its own, and
# ``f_stop.set()`` still ends it at once.
_EXTRACTOR = "add_messages_to_queue"
_WAKE = "_pfl_wake"  # the wake-up event, kept on the stop event it belongs to


def _extractor_thread() -> tuple[threading.Event, object] | None:
    for thread in threading.enumerate():
        target = getattr(thread, "_target", None)
        args = getattr(thread, "_args", ())
        if (getattr(target, "__name__", "") == _EXTRACTOR and "vce" in getattr(target, "__module__", "")
                and len(args) >= 4 and isinstance(args[3], threading.Event)):
            return args[3], target
    return None


def _hook(f_stop: threading.Event) -> threading.Event:
    wake = threading.Event()

    def wait(timeout: float | None = None) -> bool:
        if timeout is None:
            return threading.Event.wait(f_stop)
        wake.wait(timeout)
        wake.clear()
        return f_stop.is_set()

    def stop() -> None:
        threading.Event.set(f_stop)
        wake.set()  # the loop ends now, not after its wait

    f_stop.wait = wait  # instance attributes: the running loop looks them up at every pass
    f_stop.set = stop
    return wake


def kick() -> bool:
    """Wake the simulation engine's message mover; False where there is none in this process."""
    found = _extractor_thread()
    if found is None:
        return False
    f_stop, target = found
    wake = getattr(f_stop, _WAKE, None)
    if wake is None:
        check_message_mover(target)
        wake = _hook(f_stop)
        setattr(f_stop, _WAKE, wake)
    wake.set()
    return True


# ---------------------------------------------------------------- dead Ray actors leave the pool
# Flower 1.41's Ray backend runs one worker thread per actor; each takes an idle actor from
# ``BasicActorPool.pool``, runs a client on it and puts it back, also when the task failed. An actor whose
# Ray node died (machine lost, raylet killed) then went back too and failed every later client at once
# (measured with tests/test_ray_cluster.py, 20 clients on two one-CPU workers, one killed in round 2:
# stock Flower kept 15 of 20 train replies and 1 of 20 evaluations in round 2, 2 and 3 of 20 in round 3;
# with this patch 19 and 20 in round 2, all 20 in round 3). Here an actor whose task raised
# ``ActorDiedError`` (Flower starts actors without restarts), or that was unavailable or lost a finished
# reply with its node and then no longer answers, is dropped, and a thread finding no idle actor waits for
# one instead of failing on an empty list; the clients then share the actors that are left. No
# replacement is started: on a cluster without free CPUs it would wait for resources forever, holding its
# client's reply.
_POOL_LOCK = threading.Lock()


def _idle(pool) -> threading.Condition:
    with _POOL_LOCK:
        if not hasattr(pool, "_pfl_idle"):
            pool._pfl_idle = threading.Condition()
        return pool._pfl_idle


ACTOR_PROBE_S = 120  # an idle live actor answers at once; Ray declares a silent node dead within ~30 s


def _answers(ray, actor) -> bool:
    """Whether ``actor`` is alive: an actor Ray calls unavailable, or a reply of its that was lost (it
    lived in the object store of a node that died after making it), says nothing for sure until this
    asks it; once Ray has declared its node dead, the answer is ``ActorDiedError``."""
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=ACTOR_PROBE_S)
        return True
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return False


def dead_actors() -> bool:
    """Patch ``BasicActorPool`` (once per process); False where it already was."""
    pool_cls = check_actor_pool()
    if getattr(pool_cls.submit, "__wrapped__", None) is not None:
        return False
    import ray

    flower_submit = pool_cls.submit
    flower_back = pool_cls.add_actor_back_to_pool
    flower_fetch = pool_cls.fetch_result_and_return_actor_to_pool

    def submit(self, actor_fn, job):
        idle = _idle(self)
        with idle:  # a live actor comes back when another thread's client ends
            idle.wait_for(lambda: self.pool or self.num_actors <= 0)
            if not self.pool:
                raise RuntimeError("every Ray actor of the simulation has died (their nodes were lost)")
            return flower_submit(self, actor_fn, job)

    def add_actor_back_to_pool(self, future):
        idle = _idle(self)
        with idle:
            if future in self._future_to_actor:  # gone when its actor died (``fetch`` below)
                flower_back(self, future)
                idle.notify()

    def drop(self, future) -> None:
        idle = _idle(self)
        with idle:
            if self._future_to_actor.pop(future, None) is None:
                return
            self.num_actors -= 1
            idle.notify_all()  # threads waiting for an actor see when none is left
        from logging import WARNING

        from flwr.supercore import log

        log(WARNING, "a Ray actor died (its node was lost?): %s actor(s) left in the pool", self.num_actors)

    def fetch_result_and_return_actor_to_pool(self, future):
        try:
            return flower_fetch(self, future)
        except ray.exceptions.ActorDiedError:
            drop(self, future)
            raise
        # unreachable for now (ActorUnavailableError), or the reply was made on a node that is gone since
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
            actor = self._future_to_actor.get(future)
            if actor is not None and not _answers(ray, actor):
                drop(self, future)
            raise

    for name, fn, original in (("submit", submit, flower_submit),
                               ("add_actor_back_to_pool", add_actor_back_to_pool, flower_back),
                               ("fetch_result_and_return_actor_to_pool", fetch_result_and_return_actor_to_pool,
                                flower_fetch)):
        fn.__wrapped__ = original
        setattr(pool_cls, name, fn)
    return True


# ---------------------------------------------------------------- the message mover: an index, not a scan
# Flower 1.41's simulation engine moves messages to its workers in one thread (``add_messages_to_queue``): on every
# pass (each 0.1 s, and at each ``kick``) it calls ``state.get_message_ins(node_id, limit=1)`` for every node of
# the federation, and each call walks the whole ``message_ins_store`` (every message sent and not yet answered and
# pulled), checking each message's expiry (``_check_stored_messages``) under the state's lock. With N nodes and M
# stored messages a pass is N x M checks: while a round's evaluation has all 1,000 clients' messages stored, a pass
# at 1,000 clients is 10^6 checks (about 0.1-1 s of the ServerApp's process, holding the lock and the GIL the
# workers and the ServerApp need), so the cost per message grew with N. ``indexed_message_ins`` gives the state
# instance (the one object the running thread and the grid share) a per-node queue of the messages stored for
# it, filled by ``store_message_ins``: a call looks at the messages of its own node only, checks each as Flower
# does (expiry, still stored, still undelivered), and a pass costs N dictionary look-ups plus the messages it
# hands out. Messages are delivered in the order they were stored for each node, as Flower's scan did.
_INDEX = "_pfl_message_ins_index"


def indexed_message_ins(state) -> bool:
    """Index ``state``'s undelivered messages by node (once per instance); False where it already is."""
    check_link_state(state)
    if _INDEX in vars(state):
        return False
    from collections import deque

    from flwr.supercore.date import now

    flower_store, flower_get = state.store_message_ins, state.get_message_ins
    with state.lock:
        index: dict[int, deque] = {}
        for msg_id, msg in state.message_ins_store.items():  # what was sent before the patch
            index.setdefault(msg.metadata.dst_node_id, deque()).append(msg_id)
        setattr(state, _INDEX, index)

    def store_message_ins(message):
        msg_id = flower_store(message)
        if msg_id is not None:
            with state.lock:
                index.setdefault(message.metadata.dst_node_id, deque()).append(msg_id)
        return msg_id

    def get_message_ins(node_id, limit, *, run_id=None):
        if run_id is not None or limit is None or limit < 1:  # not the engine's call: Flower's own scan
            return flower_get(node_id, limit, run_id=run_id)
        if node_id not in index:  # most nodes, most of the time: nothing to look at, no lock taken
            return []
        found = []
        with state.lock:
            queue = index.get(node_id)
            while queue and len(found) < limit:
                msg_id = queue.popleft()
                state._check_stored_messages({msg_id})  # expired messages are deleted, as Flower's scan does
                msg = state.message_ins_store.get(msg_id)
                if msg is not None and msg.metadata.dst_node_id == node_id and msg.metadata.delivered_at == "":
                    found.append(msg)
            if queue is not None and not queue:
                del index[node_id]
        delivered_at = now().isoformat()
        for msg in found:
            msg.metadata.delivered_at = delivered_at
        return found

    store_message_ins.__wrapped__, get_message_ins.__wrapped__ = flower_store, flower_get
    state.store_message_ins, state.get_message_ins = store_message_ins, get_message_ins
    return True


# ---------------------------------------------------------------- pulling replies: only those that are in
# ``InMemoryGrid.pull_messages(ids)`` (``get_message_res``) checks every id it is given (expiry, node, reply) under
# the state's lock; a ServerApp waiting for W replies and pulling every 10 ms spent W checks a pull, so a phase of
# N clients cost about N^2 checks. ``replied`` reads which of the ids have a reply stored (a dictionary the state
# keeps, holding only replies not yet pulled), so that a pull asks for those alone; Flower's own pull of every id
# (which also answers, with an error reply, a message that expired or whose node went away) is still made, only
# less often (``server_app.nodes.send_and_receive``).
def replied(state, message_ids: set[str]) -> list[str]:
    """Those of ``message_ids`` whose reply is in ``state`` and not yet pulled."""
    if not getattr(state, "_pfl_checked", False):  # once per state: the check reads signatures
        check_link_state(state)
        state._pfl_checked = True
    with state.lock:
        replies = list(state.message_ins_id_to_message_res_id)
    return [i for i in replies if i in message_ids]
