"""In-process Flower federation for tests: the real ServerApp loop and ClientApp, no Ray, no SuperLink.

Messages go through Flower's own ``Message``/``RecordDict`` objects and each client keeps its own
``Context`` (so ``context.state`` persists across rounds exactly as under ``flwr run``).
"""

from __future__ import annotations

from flwr.app import Context, Message, RecordDict
from flwr.app.error import Error
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity


class LocalGrid(Grid):
    """A Grid that calls the ClientApp directly; ``faults`` lets a test corrupt or fail replies."""

    def __init__(self, client_app, num_clients: int, run_config: dict, faults=None):
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        self.app = client_app
        self.contexts = {
            1000 + 7 * i: Context(run_id=1, node_id=1000 + 7 * i,
                                  node_config={"partition-id": i, "num-partitions": num_clients},
                                  state=RecordDict(), run_config=dict(run_config))
            for i in range(num_clients)
        }
        self.faults = faults  # callable(message, reply) -> reply (or None to drop it)
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
            try:
                reply = self.app(msg, self.contexts[msg.metadata.dst_node_id])
            except Exception as err:  # a crashing ClientApp becomes an error reply, as in Flower
                reply = Message(Error(code=0, reason=repr(err)), reply_to=msg)
            if self.faults is not None:
                reply = self.faults(msg, reply)
            if reply is not None:
                out.append(reply)
        return out
