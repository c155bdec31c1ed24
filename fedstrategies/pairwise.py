"""Pairwise maths over clients' models: Gram matrices, cosines, squared distances, mixing.

Every function works on model states (``{state-dict key: array}``) and forms each result as a sum
of matrix products over the tensors, in column blocks, so that no Python loop runs over pairs and
no stack of all parameters of all clients is ever built. FedAMP (distances, mixing), CFL (cosines
of updates) and FeSEM (distances to centres) use it; FedSaC's and MuPFL's Gram matrices and
cosines (``fedsac.FedSaCStrategy.gram``, ``fedsac_math.similarity_matrix``,
``mupfl_math.cosine_matrix``) compute the same things.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

BLOCK = 1 << 22  # values per column block (16 MB of float32 for each side)
State = Mapping[str, np.ndarray]


def is_parameter(key: str) -> bool:
    """A trained tensor (in distances and similarities), not a BatchNorm statistic or counter."""
    return not key.endswith(("running_mean", "running_var", "num_batches_tracked"))


def parameter_keys(state: State, keep: Callable[[str], bool] = is_parameter) -> list[str]:
    """The float tensors of ``state`` that ``keep`` selects, in state order."""
    return [k for k, v in state.items() if keep(k) and np.asarray(v).dtype.kind == "f"]


def _blocks(states: Sequence[State], key: str, width: int):
    """(start, stop, rows) column blocks of tensor ``key`` of every state, as float32 rows (a new array)."""
    size = int(np.asarray(states[0][key]).size)
    for start in range(0, size, width):
        stop = min(size, start + width)
        yield start, stop, np.stack([np.asarray(s[key]).reshape(-1)[start:stop] for s in states], dtype=np.float32)


def gram(states: Sequence[State], others: Sequence[State] | None = None, keys: Sequence[str] | None = None,
         minus: State | None = None) -> np.ndarray:
    """G_ij = <x_i - m, y_j - m> over the parameter tensors: one matrix product per column block
    (float32 products, as BLAS is fastest there, summed in float64).

    Parameters
    ----------
    states, others : sequences of model states
        x_1..x_n and y_1..y_m (``others`` None: the states themselves, G symmetric).
    keys : the tensors that make up the vector (default: ``parameter_keys`` of the first state).
    minus : a state m subtracted from every vector (a reference model; None: no shift).
    """
    keys = list(keys) if keys is not None else parameter_keys(states[0])
    same = others is None
    others = states if same else others
    out = np.zeros((len(states), len(others)))
    width = max(1, BLOCK // max(len(states), len(others)))
    for key in keys:
        ref = None if minus is None else np.asarray(minus[key], dtype=np.float32).reshape(-1)
        right = None if same else _blocks(others, key, width)
        for start, stop, a in _blocks(states, key, width):
            if ref is not None:
                a -= ref[start:stop]
            if same:
                out += a @ a.T
                continue
            b = next(right)[2]
            if ref is not None:
                b -= ref[start:stop]
            out += a @ b.T
    return out


def cosine_matrix(g: np.ndarray) -> np.ndarray:
    """cos(x_i, x_j) from a symmetric Gram matrix; a zero vector has cosine 0 with every vector,
    itself included (no NaN from a client that did not move)."""
    g = np.asarray(g, dtype=np.float64)
    norms = np.sqrt(np.clip(np.diag(g), 0.0, None))
    inv = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    return np.clip(g * inv[:, None] * inv[None, :], -1.0, 1.0)


def squared_distances(states: Sequence[State], others: Sequence[State] | None = None,
                      keys: Sequence[str] | None = None) -> np.ndarray:
    """D_ij = ||x_i - y_j||^2 over the parameter tensors, from Gram matrices.

    The vectors are first shifted by the first state (distances do not change), so that
    ||x||^2 + ||y||^2 - 2<x, y> does not lose the small distances between nearby models to
    cancellation against their large norms. The result is clipped at 0, with an exact 0 diagonal
    when ``others`` is None.
    """
    ref = states[0]
    if others is None:
        g = gram(states, keys=keys, minus=ref)
        sq = np.diag(g)
        d = np.clip(sq[:, None] + sq[None, :] - 2.0 * g, 0.0, None)
        np.fill_diagonal(d, 0.0)
        return (d + d.T) / 2
    sq_a, sq_b = squared_norms(states, keys, ref), squared_norms(others, keys, ref)
    cross = gram(states, others, keys=keys, minus=ref)
    return np.clip(sq_a[:, None] + sq_b[None, :] - 2.0 * cross, 0.0, None)


def squared_norms(states: Sequence[State], keys: Sequence[str] | None = None, minus: State | None = None) -> np.ndarray:
    """||x_i - m||^2 of every state (the Gram diagonal without the n x n products): O(n d), one
    float32 difference and dot product per tensor, summed in float64."""
    keys = list(keys) if keys is not None else parameter_keys(states[0])
    out = np.zeros(len(states))
    for key in keys:
        ref = 0.0 if minus is None else np.asarray(minus[key]).reshape(-1)
        for i, s in enumerate(states):
            v = np.asarray(s[key], dtype=np.float32).reshape(-1) - ref
            out[i] += float(np.dot(v, v))
    return out


def mix(weights: np.ndarray, states: Sequence[State]) -> list[dict[str, np.ndarray]]:
    """out_i = sum_j W_ij x_j for every tensor (one matrix product per tensor), in each tensor's dtype.

    Float tensors are mixed by a float32 matrix product (twice as fast as float64; the models are
    float32 anyway); integer tensors (BatchNorm's step counter) are not
    parameters and take the maximum over the states with a non-zero weight in the row.
    """
    weights = np.asarray(weights, dtype=np.float64)
    w32 = weights.astype(np.float32)
    out: list[dict[str, np.ndarray]] = [{} for _ in range(len(weights))]
    for key, first in states[0].items():
        first = np.asarray(first)
        if first.dtype.kind != "f":
            stacked = np.stack([np.asarray(s[key]) for s in states])
            for i, row in enumerate(weights):
                used = stacked[row != 0] if (row != 0).any() else stacked
                out[i][key] = used.max(axis=0).astype(first.dtype)
            continue
        size = first.size
        width = max(1, BLOCK // len(states))
        result = np.empty((len(weights), size), dtype=first.dtype)
        for start in range(0, size, width):
            stop = min(size, start + width)
            block = np.stack([np.asarray(s[key]).reshape(-1)[start:stop] for s in states], dtype=np.float32)
            result[:, start:stop] = w32 @ block
        for i in range(len(weights)):
            out[i][key] = result[i].reshape(first.shape)
    return out
