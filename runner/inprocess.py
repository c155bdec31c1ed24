"""The whole federation in one process: the real ServerApp loop and ClientApp, no Ray, no SuperLink.

Every message and every client's ``context.state`` goes through Flower's own protobuf
serialisation between calls, as in the real runtimes, so a method that keeps anything in a module
global or shares an object between server and client fails here as it would under ``flwr run``.
Clients run one after another on one thread: the reference "sequential" execution that the
simulation benchmark compares with, and the engine of choice for long runs of tiny models, where
Ray's per-message overhead dominates (``engine = "inprocess"`` in a comparison preset).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable

from flwr.app import Context, Message, RecordDict
from flwr.app.error import Error
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

# faults(request, reply) -> reply, or None to lose it: lets tests corrupt or drop replies
FaultHook = Callable[[Message, Message], Message | None]


def _copy(content: RecordDict) -> RecordDict:
    return recorddict_from_proto(recorddict_to_proto(content))


class InProcessGrid(Grid):
    """A Grid that hands each message, serialised and deserialised, to the ClientApp of its node."""

    def __init__(self, client_app, num_clients: int, run_config: dict, faults: FaultHook | None = None):
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # Message() needs them
        self.app = client_app
        self.contexts = {
            1000 + 7 * i: Context(run_id=1, node_id=1000 + 7 * i,
                                  node_config={"partition-id": i, "num-partitions": num_clients},
                                  state=RecordDict(), run_config=dict(run_config))
            for i in range(num_clients)
        }
        self.faults = faults
        self.sent: list[Message] = []

    def set_run(self, run_id):
        self._run_id = run_id

    @property
    def run(self):
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content=content, message_type=message_type, dst_node_id=dst_node_id, group_id=group_id, ttl=ttl)

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for msg in messages:
            self.sent.append(msg)
            context = self.contexts[msg.metadata.dst_node_id]
            delivered = Message(content=_copy(msg.content), dst_node_id=msg.metadata.dst_node_id,
                                message_type=msg.metadata.message_type, group_id=msg.metadata.group_id)
            try:
                reply = self.app(delivered, context)
                if not reply.has_error():
                    reply = Message(content=_copy(reply.content), reply_to=msg)
            except Exception as err:  # a crashing ClientApp becomes an error reply, as in Flower
                reply = Message(Error(code=0, reason=repr(err)), reply_to=msg)
            context.state = _copy(context.state)  # state survives only as what serialises
            if self.faults is not None:
                reply = self.faults(msg, reply)
            if reply is not None:
                out.append(reply)
        return out


def pool_context(*devices: str) -> multiprocessing.context.BaseContext:
    """The start method for worker processes that run in-process runs on ``devices`` (run-config
    ``device`` values): ``spawn`` where any of them is CUDA or this process has started CUDA (a forked
    child cannot use a CUDA context its parent made: "Cannot re-initialize CUDA in forked
    subprocess"), else the platform's default (fork on Linux: CPU runs start as fast as before)."""
    import torch

    cuda = (any(str(d).startswith("cuda") for d in devices)
            or (any(str(d) == "auto" for d in devices) and torch.cuda.is_available()) or torch.cuda.is_initialized())
    return multiprocessing.get_context("spawn" if cuda else None)


def run_inprocess(run_config: dict, num_clients: int, faults: FaultHook | None = None) -> tuple[dict, InProcessGrid]:
    """Run one experiment in this process; returns its summary and the grid (for inspection)."""
    from clients.app import app as client_app
    from fedcore.config import Config, check_data, check_model, check_partition
    from server_app.app import run_experiment

    cfg = Config.from_run_config(run_config)
    check_data(cfg)  # refused before any client starts
    print(check_partition(cfg, num_clients), flush=True)
    check_model(cfg, num_clients)
    grid = InProcessGrid(client_app, num_clients, run_config, faults=faults)
    return run_experiment(grid, cfg), grid
