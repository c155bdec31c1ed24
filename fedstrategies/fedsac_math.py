"""FedSaC's server rule as plain functions on numpy arrays (Yan et al., ICML 2024, Eqs. 4, 6-8, 13-14).

One round over the participating clients S_t (all arrays are indexed by their position in S_t):

1. ``similarity_matrix``: S_ij, the cosine of the clients' flattened parameters (Eq. 4), from a
   Gram matrix that the strategy accumulates tensor by tensor;
2. ``complementarity_matrix``: C_ij = cos(mean principal angle between span(U_i), span(U_j))
   (Eqs. 6-7), for every pair at once;
3. ``alpha_at``: the complementarity weight, switched off for the last 30% of rounds;
4. ``collaboration_graph``: one convex QP per row over the simplex (Eq. 8 / 14), solved in closed
   form for all rows at once, or by cvxpy (the reference);
5. ``aggregate_by_graph``: theta~_i = sum_j W_ij theta_j, one matrix product per tensor.
"""

from __future__ import annotations

import numpy as np
from scipy.special import entr  # server code only: loaded with the strategy, not inside its first round

from fedstrategies import pairwise



# ---------------------------------------------------------------- similarity (Eq. 4)
def similarity_matrix(gram: np.ndarray, clamp: float = 1.0) -> np.ndarray:
    """Cosine similarity of every pair of vectors, from their Gram matrix G_ij = <v_i, v_j>.

    Parameters
    ----------
    gram : (n, n) array
        Inner products of the clients' flattened vectors (parameters, or updates from theta(0)).
    clamp : float
        Similarities above this become 1 (the authors' code uses 0.9); 1 keeps them as they are.

    Returns
    -------
    (n, n) array
        Symmetric, S_ii = 1, values in [-1, 1]. A zero vector (no update at all) has similarity 0
        with every other client.
    """
    norms = np.sqrt(np.clip(np.diag(gram), 0.0, None))
    denom = np.outer(norms, norms)
    s = np.divide(gram, denom, out=np.zeros_like(gram, dtype=np.float64), where=denom > 0)
    s = np.clip((s + s.T) / 2, -1.0, 1.0)
    if clamp < 1.0:
        s[s > clamp] = 1.0
    np.fill_diagonal(s, 1.0)
    return s


# ---------------------------------------------------------------- complementarity (Eqs. 6-7)
def column_cosines(bases: np.ndarray) -> np.ndarray:
    """U_i^T U_j for every pair, (n, n, k, k), as one matrix product of all the columns (a view)."""
    n, d, k = bases.shape
    columns = bases.transpose(0, 2, 1).reshape(n * k, d)
    return (columns @ columns.T).reshape(n, k, n, k).transpose(0, 2, 1, 3)


def principal_angles(bases: np.ndarray) -> np.ndarray:
    """Standard principal angles between the column spans of every pair of orthonormal bases.

    The cosines of the angles are the singular values of U_i^T U_j (Bjorck and Golub): one batched
    SVD over the pairs i <= j, mirrored. They do not depend on the choice of basis or on signs.

    Parameters
    ----------
    bases : (n, d, k) array
        Orthonormal bases U_i (d x k) of the clients' feature subspaces.

    Returns
    -------
    (n, n, k) array
        Angles in [0, pi/2], smallest first.
    """
    n, _, k = bases.shape
    rows, cols = np.triu_indices(n)
    sigma = np.linalg.svd(column_cosines(bases)[rows, cols], compute_uv=False)
    angles = np.empty((n, n, k))
    angles[rows, cols] = angles[cols, rows] = np.arccos(np.clip(sigma, 0.0, 1.0))
    return angles


def greedy_column_angles(bases: np.ndarray) -> np.ndarray:
    """The authors' code variant: match basis *columns* greedily on their signed cosines.

    k times: take the largest remaining cosine between a column of U_i and one of U_j, then remove
    that row and column. Unlike principal angles this depends on the basis and its signs, and the
    angles lie in [0, pi]. Vectorised over all pairs (k steps of masked argmax).

    Returns
    -------
    (n, n, k) array
        The matched angles, in the order they were picked.
    """
    n, _, k = bases.shape
    cos = column_cosines(bases / np.linalg.norm(bases, axis=1, keepdims=True)).reshape(n, n, k * k)
    picked = np.empty((n, n, k))
    rows, cols = np.arange(k * k) // k, np.arange(k * k) % k
    for step in range(k):
        best = cos.argmax(axis=2)
        picked[..., step] = np.take_along_axis(cos, best[..., None], axis=2)[..., 0]
        used = (rows[None, None, :] == (best // k)[..., None]) | (cols[None, None, :] == (best % k)[..., None])
        cos[used] = -np.inf
    return np.arccos(np.clip(picked, -1.0, 1.0))


def complementarity_matrix(bases: np.ndarray, angles: str = "standard") -> np.ndarray:
    """C_ij = cos(mean principal angle between span(U_i) and span(U_j)) (Eq. 7).

    A large C means the two clients' features overlap (little to gain from each other's data). In
    ``standard`` mode C is symmetric with C_ii = 1 and C in [0, 1].
    """
    phi = principal_angles(bases) if angles == "standard" else greedy_column_angles(bases)
    c = np.cos(phi.mean(axis=2))
    c = (c + c.T) / 2
    np.fill_diagonal(c, 1.0)
    return c


# ---------------------------------------------------------------- the alpha schedule
def alpha_at(server_round: int, num_rounds: int, alpha: float, on_fraction: float = 0.7,
             boundary: str = "paper") -> float:
    """The complementarity weight of a round: alpha for the first ``on_fraction`` of the rounds, then 0.

    Rounds count from t = 0 as in the paper (Flower's round 1 is t = 0). ``paper``: on while
    t < 0.7 T (T = 50: t = 0..34, i.e. Flower rounds 1..35). ``code``: the authors' ``t / T > 0.7``
    switches it off, so it stays on one round longer (t = 0..35).
    """
    t = server_round - 1
    if boundary == "paper":
        on = t < on_fraction * num_rounds - 1e-9
    else:
        on = not t / num_rounds > on_fraction + 1e-12
    return alpha if on else 0.0


# ---------------------------------------------------------------- the QP (Eq. 8 / 14)
def qp_targets(p: np.ndarray, similarity: np.ndarray, complementarity: np.ndarray, alpha: float,
               beta: float) -> np.ndarray:
    """Row i of the result is the unconstrained minimiser of row i's objective.

    sum_j (w_j - p_j)^2 + alpha C_ij w_j - beta S_ij w_j = ||w - (p + (beta S_i - alpha C_i) / 2)||^2
    + const, so the QP is the Euclidean projection of this point onto the simplex.
    """
    return p[None, :] + (beta * similarity - alpha * complementarity) / 2


def project_rows_to_simplex(points: np.ndarray) -> np.ndarray:
    """Euclidean projection of every row onto the probability simplex {w >= 0, sum w = 1}.

    The sort-based algorithm (Held et al. 1974; Duchi et al. 2008), on all rows at once: no
    library offers it vectorised over rows (scipy/scikit-learn have none), and it is six lines.
    """
    n = points.shape[1]
    desc = -np.sort(-points, axis=1)
    excess = np.cumsum(desc, axis=1) - 1.0
    ranks = np.arange(1, n + 1)
    support = (desc - excess / ranks) > 0  # true for a prefix of every row
    count = support.sum(axis=1)
    shift = excess[np.arange(len(points)), count - 1] / count
    return np.maximum(points - shift[:, None], 0.0)


def qp_objective(w: np.ndarray, p: np.ndarray, similarity: np.ndarray, complementarity: np.ndarray,
                 alpha: float, beta: float) -> np.ndarray:
    """Eq. 8's objective of each row of ``w`` (for tests and diagnostics)."""
    return ((w - p[None, :]) ** 2 + alpha * complementarity * w - beta * similarity * w).sum(axis=1)


def solve_graph_cvxpy(p: np.ndarray, similarity: np.ndarray, complementarity: np.ndarray, alpha: float,
                      beta: float) -> np.ndarray:
    """The reference solver: Eq. 14 (min sum_j w_j^2 + q_ij w_j over the simplex) with cvxpy.

    The rows are independent, so all of them go into one problem with an (n, n) variable, which
    equals n separate solves and saves n - 1 canonicalisations. OSQP with tight tolerances and
    solution polishing (an active-set step) returns the exact optimum; with default tolerances, or
    with Clarabel, rows can be off by 1e-5 at n = 100. As in the spec, values below 0 are clipped
    and rows renormalised afterwards.
    """
    import cvxpy as cp

    n = len(p)
    q = alpha * complementarity - beta * similarity - 2 * p[None, :]
    w = cp.Variable((n, n))
    problem = cp.Problem(cp.Minimize(cp.sum_squares(w) + cp.sum(cp.multiply(q, w))),
                         [w >= 0, cp.sum(w, axis=1) == 1])
    problem.solve(solver=cp.OSQP, eps_abs=1e-10, eps_rel=1e-10, max_iter=100_000, polishing=True)
    if w.value is None:
        raise RuntimeError(f"cvxpy could not solve the collaboration QP: {problem.status}")
    out = np.clip(w.value, 0.0, None)
    return out / out.sum(axis=1, keepdims=True)


def collaboration_graph(p: np.ndarray, similarity: np.ndarray, complementarity: np.ndarray, alpha: float,
                        beta: float, solver: str = "closed_form") -> np.ndarray:
    """W (n x n, rows on the simplex): row i solves
    min_w sum_j (w_j - p_j)^2 + alpha C_ij w_j - beta S_ij w_j  s.t. w >= 0, sum_j w_j = 1 (Eq. 8).

    ``closed_form`` projects ``qp_targets`` onto the simplex (exact, all rows at once);
    ``cvxpy`` solves the QP numerically.
    """
    if solver == "cvxpy":
        return solve_graph_cvxpy(p, similarity, complementarity, alpha, beta)
    return project_rows_to_simplex(qp_targets(p, similarity, complementarity, alpha, beta))


# ---------------------------------------------------------------- what the graph learned (issue #30)
def graph_diagnostics(graph: np.ndarray, p: np.ndarray, similarity: np.ndarray,
                      complementarity: np.ndarray | None = None) -> dict[str, float]:
    """One round's graph in a few numbers for rounds.csv, to follow what W learns over the rounds.

    ``self-weight``: mean W_ii; ``row-entropy``: mean over rows of -sum_j W_ij ln W_ij (0: a row on one
    client, ln n: uniform); ``dist-to-p``: mean over rows of sum_j |W_ij - p_j| (0: FedAvg's weights, at
    most 2); ``similarity``/``complementarity`` and their ``-std``: mean and spread of the off-diagonal
    S and C (1 and 0 in a round of one client).
    """
    off = ~np.eye(len(graph), dtype=bool)
    out = {"self-weight": float(np.diag(graph).mean()), "row-entropy": float(entr(graph).sum(axis=1).mean()),
           "dist-to-p": float(np.abs(graph - p[None, :]).sum(axis=1).mean())}
    for name, matrix in (("similarity", similarity), ("complementarity", complementarity)):
        if matrix is not None:
            values = matrix[off] if off.any() else np.ones(1)
            out[name], out[f"{name}-std"] = float(values.mean()), float(values.std())
    return out


# ---------------------------------------------------------------- aggregation (Alg. 1 line 14)
def aggregate_by_graph(graph: np.ndarray, stacked: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """theta~_i = sum_j W_ij theta_j for one tensor: ``stacked`` is (n, ...) (one row per client),
    the result has the same shape, the product on the server device. Integer tensors (BatchNorm's step
    counters) are rounded back. ``out``: a C-contiguous (n, size) array of a float tensor's dtype that the
    product writes into (a caller mixing column block after column block reuses one)."""
    flat = stacked.reshape(len(stacked), -1)
    if flat.dtype.kind == "f":
        out = pairwise.product(graph.astype(flat.dtype), flat, out)
    else:
        out = np.rint(graph @ flat.astype(np.float64)).astype(flat.dtype)
    return out.reshape(stacked.shape)
