"""FedSaC (Yan et al., ICML 2024): a collaboration graph that balances similarity and complementarity.

Every round each participating client starts from its personalised model theta~_i, trains it with
cross-entropy minus lambda * cos(theta, theta~_i) (clients/fedsac.py) and uploads its parameters
theta_i and an orthonormal basis U_i (d x k) of its penultimate-layer features. The server then
(fedstrategies/fedsac_math.py):

- measures model similarity S_ij (cosine of the updates theta_j - theta(0), or of the raw parameters)
  and feature overlap C_ij (cosine of the mean principal angle between span U_i and span U_j);
- solves one QP per client over the simplex: keep W_i. near the data weights p, reward S, penalise C
  (alpha is switched off for the last 30% of rounds);
- sends client i theta~_i = sum_j W_ij theta_j at its next train message and at every evaluation.

Under partial participation (the paper's large-scale runs sample 10 clients per round) only the
S_t x S_t block of W and the theta~ of the clients in S_t change; a client that has never been
aggregated gets theta(0). The theta~_i are kept in their wire form: packed once when computed,
then sent as they are (train and evaluate messages), never copied again.
"""

from __future__ import annotations

import numpy as np

from fedcore import wire
from fedcore.methods.fedsac import BASIS, REFERENCE, REGULARISER, REGULARISER_OFF, SUBSPACE
from fedstrategies import pairwise
from fedstrategies.base import PersonalizedStrategy, weights_schema
from fedstrategies.fedsac_math import (aggregate_by_graph, alpha_at,
                                       collaboration_graph, complementarity_matrix, graph_diagnostics,
                                       similarity_matrix)

ORTHONORMAL_TOL = 1e-3  # |U^T U - I| a basis may show (float32 rounding is ~1e-7)
GRAM_BLOCK = 1 << 24  # values per column block of the similarity Gram matrix (64 MB of float32)


class FedSaCStrategy(PersonalizedStrategy):
    """Per-client models mixed by the FedSaC collaboration graph.

    State between rounds: ``personal`` (pid -> packed theta~_i), ``graph_rows`` (the rows of W the rounds
    wrote: pid -> (partition ids, weights), each round writing the S_t x S_t block of its sampled clients),
    ``num_examples`` (pid -> n_i of its last reply), ``references`` (the authors' regulariser vectors, in
    that mode), and theta(0) (``initial_weights``). All of it grows with the clients aggregated so far, none
    with N^2: no rule reads W outside the round's block, so the N x N matrix (``graph``) is only built when
    asked for.
    """

    checkpoint_attrs = ("personal", "references", "graph_rows", "num_examples", "initial_weights")

    def __init__(self, cfg, clients, model):
        super().__init__(cfg, clients, model)
        self.check_model(model)
        if self.hp["solver"] == "cvxpy":
            import cvxpy  # noqa: F401  (seconds to import: once per run, not in the first round's time)
        self.personal: dict = {}
        self.references: dict = {}
        self.graph_rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.num_examples: dict[int, int] = {}

    def check_model(self, model) -> None:
        """The subspace rank must fit the model's feature width."""
        if self.hp["k"] > model.feature_dim:
            raise ValueError(f"fedsac.k = {self.hp['k']} exceeds the feature dimension {model.feature_dim} "
                             f"of model {model.name!r}")

    # ------------------------------------------------------------ messages
    def personal_record(self, pid: int):
        """theta~_i as sent: the aggregated model, or theta(0) before client ``pid`` was first aggregated."""
        if pid in self.personal:
            return self.personal[pid]
        return self.packed("initial", lambda: wire.pack_arrays(self.initial_weights))

    def train_payload(self, pid, server_round):
        payload = {wire.WEIGHTS: self.personal_record(pid)}
        if self.hp["regulariser"] == "authors" and pid in self.references:
            payload[REFERENCE] = self.references[pid]
        return payload

    def train_config(self, pid, server_round):
        """The regulariser is on once the client has an aggregated model: in its first round theta~_i
        is theta(0), and the authors' code trains without it then."""
        return {REGULARISER: self.hp["regulariser"] if pid in self.personal else REGULARISER_OFF}

    def reply_schema(self, pid):
        return {wire.WEIGHTS: weights_schema(self.initial_weights),
                SUBSPACE: {BASIS: (self.model.feature_dim, self.hp["k"])}}

    def check_reply(self, reply):
        if reply.num_examples <= 0:
            return "num-examples must be positive (it is the client's data weight p_j)"
        basis = reply.arrays[SUBSPACE][BASIS].astype(np.float64)
        error = np.abs(basis.T @ basis - np.eye(basis.shape[1])).max()
        if not error <= ORTHONORMAL_TOL:
            return f"subspace basis is not orthonormal (max |U^T U - I| = {error:.3g})"
        return None

    def evaluate_payload(self, pid, server_round):
        """theta~_i: clients score it beside their own last trained theta_i (``eval-model`` picks the headline)."""
        return {wire.WEIGHTS: self.personal_record(pid)}

    # ------------------------------------------------------------ the server rule
    def aggregate(self, server_round, replies):
        pids = [r.pid for r in replies]
        n = np.array([r.num_examples for r in replies], dtype=np.float64)
        p = n / n.sum()
        states = [r.arrays[wire.WEIGHTS] for r in replies]  # read-only views of the replies: never stacked whole
        similarity = similarity_matrix(self.gram(states), self.hp["sim-clamp"])
        graph, metrics = self.solve_graph(server_round, p, similarity, replies)

        if self.hp["regulariser"] == "authors":
            self.references.update(zip(pids, self.authors_references(graph, states)))
        self.personal.update(zip(pids, self.mixed_records(graph, states, list(self.initial_weights))))
        self.write_block(pids, graph)
        self.num_examples.update(zip(pids, (int(v) for v in n)))

        self.record_matrix("graph", graph)
        self.record_matrix("similarity", similarity)
        self.record_matrix("pids", np.array(pids))
        return metrics

    def solve_graph(self, server_round: int, p: np.ndarray, similarity: np.ndarray,
                    replies: list) -> tuple[np.ndarray, dict]:
        """W of this round (Eq. 8) and its metrics: the complementarity of the uploaded bases, the
        alpha of the round, and ``graph_diagnostics``."""
        bases = np.stack([r.arrays[SUBSPACE][BASIS] for r in replies]).astype(np.float64)
        complementarity = complementarity_matrix(bases, self.hp["angles"])
        self.record_matrix("complementarity", complementarity)
        alpha = alpha_at(server_round, self.cfg["num-server-rounds"], self.hp["alpha"],
                         self.hp["alpha-fraction"], self.hp["alpha-boundary"])
        graph = collaboration_graph(p, similarity, complementarity, alpha, self.hp["beta"], self.hp["solver"])
        return graph, {"alpha": alpha, **graph_diagnostics(graph, p, similarity, complementarity)}

    def gram(self, states: list) -> np.ndarray:
        """<v_i, v_j> over all parameters, one tensor at a time (never one matrix of all parameters).

        v_j = theta_j - theta(0) (``delta_init``) or theta_j (``params``). The rows are taken from the
        states (the replies' views) in column blocks of at most ``GRAM_BLOCK`` values, so the temporary
        stays small at 1,000 clients; each block's float32 product ``v @ v.T`` is summed in float64, on the
        server device (``pairwise.row_gram``).
        """
        n = len(states)
        width = max(1, GRAM_BLOCK // n)
        delta = self.hp["sim-vector"] == "delta_init"

        def blocks():
            for key in states[0]:
                if pairwise.is_parameter(key):
                    flat = [np.asarray(s[key]).reshape(-1) for s in states]
                    init = self.initial_weights[key].reshape(-1) if delta else None
                    for start in range(0, flat[0].size, width):
                        yield ([row[start:start + width] for row in flat],
                               None if init is None else init[start:start + width])

        return pairwise.row_gram(blocks(), n, capacity=width * n)

    def mixed_records(self, weights: np.ndarray, states: list, keys: list[str]) -> list:
        """One packed record per row i of ``weights``: sum_j W_ij theta_j of every tensor in ``keys``, computed
        in column blocks of at most ``GRAM_BLOCK`` values (``aggregate_by_graph`` on each) and written straight
        into the records' bytes (``wire.empty_packed``): no stack of the states and no mixed models beside
        the records."""
        n = len(states)
        width = max(1, GRAM_BLOCK // n)
        first = states[0]
        buffers = [wire.empty_packed({k: (np.asarray(first[k]).dtype, np.asarray(first[k]).shape) for k in keys})
                   for _ in range(len(weights))]
        outs = block = stacked = mix = stack_buf = mix_buf = None
        scratch: dict[np.dtype, tuple[np.ndarray, np.ndarray]] = {}  # per dtype: the stacked block, its mix
        for key in keys:
            flat = [np.asarray(s[key]).reshape(-1) for s in states]
            outs = [views[key].reshape(-1) for _, views in buffers]
            dtype, m = flat[0].dtype, len(weights)
            if dtype not in scratch:  # reused block after block: no fresh pages per block
                scratch[dtype] = (np.empty(n * width, dtype), np.empty(m * width, dtype))
            stack_buf, mix_buf = scratch[dtype]
            for start in range(0, flat[0].size, width):
                cols = min(width, flat[0].size - start)
                stacked = stack_buf[:n * cols].reshape(n, cols)
                np.stack([row[start:start + width] for row in flat], out=stacked)
                mix = mix_buf[:m * cols].reshape(m, cols) if dtype.kind == "f" else None
                block = aggregate_by_graph(weights, stacked, mix)
                for out, row in zip(outs, block):
                    out[start:start + width] = row
        del outs, block, scratch, stacked, mix, stack_buf, mix_buf  # the scratch goes before the records are made
        records = []
        for i in range(len(buffers)):  # each buffer goes as its record is made: never both of all of them
            records.append(wire.packed_record(buffers[i][0]))
            buffers[i] = None
        return records

    def authors_references(self, graph: np.ndarray, states: list) -> list:
        """c_i = sum_j W_ij theta_j / |theta_j| for every parameter tensor (the authors' regulariser), one packed
        record per client."""
        keys = [k for k in states[0] if pairwise.is_parameter(k)]
        sq = np.array([sum(float(np.dot(v, v)) for v in (np.asarray(s[k], dtype=np.float64).reshape(-1) for k in keys))
                       for s in states])
        scaled = graph / np.sqrt(np.maximum(sq, 1e-30))[None, :]
        return self.mixed_records(scaled, states, keys)

    def write_block(self, pids: list[int], block: np.ndarray) -> None:
        """W[pids, pids] = ``block``: row i keeps its weights to clients outside ``pids`` from earlier rounds."""
        cols = np.asarray(pids, dtype=np.int64)
        for pid, weights in zip(pids, np.asarray(block, dtype=np.float64)):
            old_cols, old_weights = self.graph_rows.get(pid, (cols[:0], weights[:0]))
            keep = ~np.isin(old_cols, cols)
            merged_cols = np.concatenate([old_cols[keep], cols])
            order = np.argsort(merged_cols, kind="stable")
            self.graph_rows[pid] = (merged_cols[order], np.concatenate([old_weights[keep], weights])[order])

    @property
    def graph(self) -> np.ndarray:
        """W as an N x N matrix (rows and columns in partition-id order, zeros where no round wrote): built on
        each call, for inspection and tests of small runs."""
        index = {pid: i for i, pid in enumerate(self.clients)}
        dense = np.zeros((len(index), len(index)))
        for pid, (cols, weights) in self.graph_rows.items():
            dense[index[pid], [index[c] for c in cols.tolist()]] = weights
        return dense

    def personal_weights(self, pid: int) -> dict[str, np.ndarray]:
        """theta~_i as numpy arrays (read-only views of the packed record)."""
        return wire.unpack_arrays(self.personal_record(pid))

    def load_state_dict(self, state):
        dense = state["method"].pop("graph", None)  # a checkpoint written before graph_rows: its rows written
        super().load_state_dict(state)
        if dense is not None:
            pids = list(self.clients)
            self.graph_rows = {pids[i]: (np.asarray(pids, dtype=np.int64)[np.flatnonzero(row)], row[row != 0])
                               for i, row in enumerate(np.asarray(dense)) if row.any()}
