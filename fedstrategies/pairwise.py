"""Pairwise maths over clients' models: Gram matrices, cosines, squared distances, mixing.

The server's one path for these products: every strategy forms them here, and no other strategy module calls
``server_device``'s products (``tests/test_pairwise.py`` checks; MuPFL's feature matching only places its own
training on the server device). Model states (``{state-dict key: array}``): each result is a sum of matrix products over
the tensors, in column blocks, so that no Python loop runs over pairs and no stack of all parameters of all
clients is ever built (FedAMP's distances and mixing, CFL's cosines of updates, FeSEM's distances to
centres). Rows already stacked by tensor (``row_gram``, ``gram_rows``, ``product``, ``gram_and_mix``):
FedSaC's and pFedGraph's similarity Gram matrix and mixing W @ Theta, MuPFL's update and map Gram
matrices, FedMCSA's attention and mixing.

Two shortcuts keep a round at 1,000 clients cheap without changing any result beyond float rounding:

- states passed as the same object (FedAMP's clients that never uploaded all count with the one
  initial model) are computed with once and the result is expanded (``_distinct``): a Gram matrix
  over g distinct objects costs O(g^2 d), and ``mix`` first adds up the weights of each object's
  columns;
- against a few vectors (FeSEM's K centres) or with few non-zero weights (FeSEM's one-hot M-step),
  the states are streamed one by one (``_stream_cross``, ``_stream_mix``) instead of being copied
  into column blocks for a matrix product with a handful of rows.

A dense round over m distinct models (FedAMP and HeurFedAMP once every client has uploaded) still
costs O(m^2 d) in two matrix products, the Gram matrix and W @ Theta: both run in torch on the
run's ``server-device`` (``server_device.GramSum`` and ``Uploader``; on a loaded 2-core CPU, 100 CNN
models' distances took 0.5 s in torch against 3.6-5.5 s in numpy's blocked products). The streamed
paths (a few vectors, few weights) stay numpy: O(n d) passes over host memory, bound by reading it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from fedstrategies import server_device

BLOCK = 1 << 22  # values per column block (16 MB of float32 for each side)
STREAM_ROWS = 16  # against at most this many vectors, gram streams the other side instead of stacking it
STREAM_BLOCK = 1 << 16  # values per product while streaming (float32 partial sums, added in float64)
State = Mapping[str, np.ndarray]


def is_parameter(key: str) -> bool:
    """A trained tensor (in distances and similarities), not a BatchNorm statistic or counter."""
    return not key.endswith(("running_mean", "running_var", "num_batches_tracked"))


def parameter_keys(state: State, keep: Callable[[str], bool] = is_parameter) -> list[str]:
    """The float tensors of ``state`` that ``keep`` selects, in state order."""
    return [k for k, v in state.items() if keep(k) and np.asarray(v).dtype.kind == "f"]


def _distinct(states: Sequence[State]) -> tuple[list[State], np.ndarray]:
    """The distinct state objects (by identity, in first-seen order) and each state's index among them."""
    seen: dict[int, int] = {}
    unique: list[State] = []
    index = np.empty(len(states), dtype=np.intp)
    for i, s in enumerate(states):
        j = seen.setdefault(id(s), len(unique))
        if j == len(unique):
            unique.append(s)
        index[i] = j
    return unique, index


def _expand(m: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """m over distinct objects -> the matrix over the states (no copy when nothing repeats)."""
    if len(rows) == m.shape[0] and len(cols) == m.shape[1]:
        return m
    return m[np.ix_(rows, cols)]


def _flat32(state: State, key: str) -> np.ndarray:
    return np.asarray(state[key], dtype=np.float32).reshape(-1)


def _stream_cross(large: Sequence[State], small: Sequence[State], keys: Sequence[str],
                  minus: State | None) -> tuple[np.ndarray, np.ndarray]:
    """(<x_i - m, y_k - m> for every x_i of ``large`` and y_k of ``small``, ||x_i - m||^2), in one pass
    over ``large`` with no copy of it: per tensor, the few y_k are stacked once and every x_i - m
    meets them in one float32 product per STREAM_BLOCK values (summed in float64)."""
    cross = np.zeros((len(large), len(small)))
    sq = np.zeros(len(large))
    for key in keys:
        ref = None if minus is None else _flat32(minus, key)
        b = np.stack([_flat32(s, key) for s in small])
        if ref is not None:
            b -= ref
        size = b.shape[1]
        for i, s in enumerate(large):
            v = _flat32(s, key)
            if ref is not None:
                v = v - ref
            for start in range(0, size, STREAM_BLOCK):
                part = v[start:start + STREAM_BLOCK]
                cross[i] += b[:, start:start + STREAM_BLOCK] @ part
                sq[i] += float(np.dot(part, part))
    return cross, sq


def _blocks(states: Sequence[State], key: str, width: int):
    """(start, stop, rows) column blocks of tensor ``key`` of every state, as lists of flat row views."""
    size = int(np.asarray(states[0][key]).size)
    for start in range(0, size, width):
        stop = min(size, start + width)
        yield start, stop, [np.asarray(s[key]).reshape(-1)[start:stop] for s in states]


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
    us, ia = _distinct(states)
    if others is None:
        return _expand(_gram(us, None, keys, minus), ia, ia)
    uo, ib = _distinct(others)
    if min(len(us), len(uo)) <= STREAM_ROWS:
        if len(uo) <= len(us):
            return _expand(_stream_cross(us, uo, keys, minus)[0], ia, ib)
        return _expand(_stream_cross(uo, us, keys, minus)[0].T, ia, ib)
    return _expand(_gram(us, uo, keys, minus), ia, ib)


def _gram(states: Sequence[State], others: Sequence[State] | None, keys: Sequence[str],
          minus: State | None) -> np.ndarray:
    """``gram`` over distinct states: one float32 matrix product per column block of every tensor, on
    the server device (``server_device.GramSum``)."""
    same = others is None
    others = states if same else others
    width = max(1, BLOCK // max(len(states), len(others)))
    out = server_device.GramSum(len(states), len(others), width * max(len(states), len(others)))
    for key in keys:
        ref = None if minus is None else server_device.tensor(np.asarray(minus[key]).reshape(-1))
        right = None if same else _blocks(others, key, width)
        for start, stop, a in _blocks(states, key, width):
            out.add(a, None if same else next(right)[2], None if ref is None else ref[start:stop])
    return out.result()


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
    keys = list(keys) if keys is not None else parameter_keys(ref)
    us, ia = _distinct(states)
    uo, ib = _distinct(others)
    if len(uo) <= STREAM_ROWS <= len(us):  # many models against a few centres: one pass over the models
        cross, sq_a = _stream_cross(us, uo, keys, ref)
        sq_b = squared_norms(uo, keys, ref)
    else:
        sq_a, sq_b = squared_norms(us, keys, ref), squared_norms(uo, keys, ref)
        cross = gram(us, uo, keys=keys, minus=ref)
    d = np.clip(sq_a[:, None] + sq_b[None, :] - 2.0 * cross, 0.0, None)
    return _expand(d, ia, ib)


def squared_norms(states: Sequence[State], keys: Sequence[str] | None = None, minus: State | None = None) -> np.ndarray:
    """||x_i - m||^2 of every state (the Gram diagonal without the n x n products): O(n d), one
    float32 difference and dot product per tensor, summed in float64."""
    keys = list(keys) if keys is not None else parameter_keys(states[0])
    unique, index = _distinct(states)
    out = np.zeros(len(unique))
    for key in keys:
        ref = 0.0 if minus is None else np.asarray(minus[key]).reshape(-1)
        for i, s in enumerate(unique):
            v = np.asarray(s[key], dtype=np.float32).reshape(-1) - ref
            out[i] += float(np.dot(v, v))
    return out[index]


def mix(weights: np.ndarray, states: Sequence[State]) -> list[dict[str, np.ndarray]]:
    """out_i = sum_j W_ij x_j for every tensor, in each tensor's dtype.

    Float tensors: with few non-zero weights (at most two per distinct state, e.g. FeSEM's one-hot
    M-step) each state is streamed once into float64 sums; otherwise one float32 matrix product per
    column block (twice as fast as float64; the models are float32 anyway). Both use the float32
    weights. Integer tensors (BatchNorm's step counter) are
    not parameters and take the maximum over the states with a non-zero weight in the row (over all
    states for an all-zero row). States given as the same object are one column (their weights
    added), and rows whose float32 weights come out equal share one output dict (round 1 of FedAMP:
    one cloud for every client): do not modify the outputs in place.
    """
    weights = np.asarray(weights, dtype=np.float64)
    k = len(weights)
    unique, index = _distinct(states)
    used = weights != 0
    if len(unique) < len(states):  # add up the columns of each distinct object
        order = np.argsort(index, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(index[order]) != 0])
        weights = np.add.reduceat(weights[:, order], starts, axis=1)
        used = np.add.reduceat(used[:, order].astype(np.intp), starts, axis=1) > 0
    w32 = weights.astype(np.float32)
    rows: dict[bytes, int] = {}  # equal rows (same float32 weights, same used states) are computed once
    row_of = np.array([rows.setdefault(w32[i].tobytes() + used[i].tobytes(), len(rows)) for i in range(k)],
                      dtype=np.intp)
    first = np.unique(row_of, return_index=True)[1]
    w32, used = w32[first], used[first]
    out: list[dict[str, np.ndarray]] = [{} for _ in range(len(first))]
    stream = np.count_nonzero(w32) <= 2 * len(unique)
    for key, first_value in unique[0].items():
        first_value = np.asarray(first_value)
        if first_value.dtype.kind != "f":
            stacked = np.stack([np.asarray(s[key]) for s in unique])
            for i, mask in enumerate(used):
                chosen = stacked[mask] if mask.any() else stacked
                out[i][key] = chosen.max(axis=0).astype(first_value.dtype)
            continue
        result = (_stream_mix(w32, unique, key, first_value.size) if stream
                  else _gemm_mix(w32, unique, key, first_value.size, first_value.dtype))
        for i in range(len(out)):
            out[i][key] = result[i].reshape(first_value.shape).astype(first_value.dtype, copy=False)
    return [out[r] for r in row_of]


def _stream_mix(w32: np.ndarray, states: Sequence[State], key: str, size: int) -> np.ndarray:
    """sum_j W_ij x_j of tensor ``key`` over the non-zero weights only: float32 products (as in the
    matrix product) added into float64 sums. numpy, single-threaded: torch's ``add_`` spreads each
    tensor over OpenMP threads, which spin-wait when the cores are busy (at 1,000 clients on a loaded
    2-core machine: 2.3 CPU-s instead of 0.1)."""
    acc = np.zeros((len(w32), size))
    for j, s in enumerate(states):
        rows = np.flatnonzero(w32[:, j])
        if len(rows):
            x = _flat32(s, key)
            for i in rows:
                acc[i] += x * w32[i, j]
    return acc


def _gemm_mix(w32: np.ndarray, states: Sequence[State], key: str, size: int, dtype) -> np.ndarray:
    """W @ [x_j] of tensor ``key``: one float32 matrix product per column block, on the server device."""
    width = max(1, BLOCK // len(states))
    upload = server_device.Uploader(width * len(states))
    w = server_device.tensor(w32)
    result = np.empty((len(w32), size), dtype=dtype)
    for start in range(0, size, width):
        stop = min(size, start + width)
        block = upload.rows([np.asarray(s[key]).reshape(-1)[start:stop] for s in states])
        result[:, start:stop] = server_device.to_host(server_device.product(w, block))
    return result


# ---------------------------------------------------------------- rows stacked by tensor
Block = tuple[Sequence[np.ndarray] | np.ndarray, np.ndarray | None]  # a column block's rows and reference


def row_gram(blocks: Iterable[Block], n: int, capacity: int) -> np.ndarray:
    """G = sum_b (A_b - m_b)(A_b - m_b)^T over column blocks of n rows, each given as (its n rows of values, the
    reference m_b: one row subtracted from every row, one row per row, or None), each block's float32 product
    summed in float64 on the server device; ``capacity``: the most values a block holds (one upload buffer)."""
    out = server_device.GramSum(n, capacity=capacity)
    for rows, minus in blocks:
        out.add(rows, minus=None if minus is None else server_device.tensor(minus))
    return out.result()


def gram_rows(x: np.ndarray, dtype: str | None = None) -> np.ndarray:
    """X X^T of the rows of ``x`` on the server device in ``dtype`` (a torch dtype's name; None: x's own), as
    float64 (one upload: no transposed copy)."""
    import torch

    return server_device.gram(np.asarray(x), None if dtype is None else getattr(torch, dtype))


def product(left: np.ndarray, right: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """left @ right on the server device in the arrays' own dtype: the mixing W @ Theta of whole stacked
    tensors (FedSaC, pFedGraph) and products of small matrices; ``out``: a host array to write it into."""
    return server_device.matmul(left, right, out)


def gram_and_mix(x: np.ndarray, weights_of: Callable[[np.ndarray | None], np.ndarray],
                 gram_dtype: str | None = "float64") -> tuple[np.ndarray, np.ndarray]:
    """(W, W @ X) with one upload of the rows of ``x``: W = ``weights_of(X X^T)``, the Gram matrix formed on the
    server device in ``gram_dtype`` (returned as float64), or ``weights_of(None)`` when ``gram_dtype`` is None
    (weights that need no Gram matrix); the mixing product in x's dtype."""
    import torch

    on_device = server_device.put(x)
    g = None if gram_dtype is None else server_device.gram(on_device, getattr(torch, gram_dtype))
    w = weights_of(g)
    mixed = server_device.to_host(server_device.product(server_device.put(w.astype(x.dtype)), on_device))
    return w, mixed
