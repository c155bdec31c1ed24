"""FedSaC, function by function: every number of the server rule and of the client checked against a
second computation (explicit loops, hand values, KKT conditions, a manual training loop), fast enough
for mutation testing (``make mutation METHOD=fedsac``)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ConfigRecord, RecordDict
from torch.nn.utils import parameters_to_vector

from tests.fakes import fake_clients
from clients.base import ClientEnv
from clients.fedsac import MODEL, FedSaCClient, regulariser, subspace_basis
from clients.training import evaluate_model, extract_features, train_loop
from fedcore import wire
from fedcore.config import Config, ConfigError
from fedcore.methods.fedsac import (AGGREGATED_ACC, BASIS, COS_TO_RECEIVED, LOCAL_ACC, REFERENCE, REGULARISER, SUBSPACE,
                                    example_reply)
from fedcore.models import ModelFacts, seeded_model
from fedstrategies import fedsac as fedsac_module
from fedstrategies.base import ClientReply
from fedstrategies.fedsac import FedSaCStrategy
from fedstrategies.pairwise import is_parameter
from fedstrategies.fedsac_math import (aggregate_by_graph, alpha_at, collaboration_graph, column_cosines,
                                       complementarity_matrix, graph_diagnostics, greedy_column_angles, principal_angles,
                                       project_rows_to_simplex, qp_objective, qp_targets, similarity_matrix,
                                       solve_graph_cvxpy)
from tests.conftest import test_device


def instance(rng, n):
    p = rng.random(n) + 0.05
    s, c = rng.uniform(-1, 1, (n, n)), rng.random((n, n))
    s, c = (s + s.T) / 2, (c + c.T) / 2
    np.fill_diagonal(s, 1.0)
    np.fill_diagonal(c, 1.0)
    return p / p.sum(), s, c


def orthonormal(rng, d, k):
    return np.linalg.qr(rng.standard_normal((d, k)))[0]


# ================================================================= the QP (Eq. 8 / 14)
def test_qp_targets_and_objective_by_hand():
    """Row i's unconstrained minimiser is p + (beta S_i - alpha C_i) / 2; the objective of one row by hand."""
    p = np.array([0.5, 0.5])
    s = np.array([[1.0, 0.2], [0.2, 1.0]])
    c = np.array([[1.0, 0.6], [0.6, 1.0]])
    np.testing.assert_allclose(qp_targets(p, s, c, 0.9, 1.4), [[0.5 + (1.4 - 0.9) / 2, 0.5 + (0.28 - 0.54) / 2],
                                                             [0.5 + (0.28 - 0.54) / 2, 0.5 + (1.4 - 0.9) / 2]])
    w = np.array([[0.7, 0.3], [0.1, 0.9]])
    by_hand = [(0.2 ** 2 + 0.2 ** 2) + 0.9 * (0.7 + 0.6 * 0.3) - 1.4 * (0.7 + 0.2 * 0.3),
               (0.4 ** 2 + 0.4 ** 2) + 0.9 * (0.6 * 0.1 + 0.9) - 1.4 * (0.2 * 0.1 + 0.9)]
    np.testing.assert_allclose(qp_objective(w, p, s, c, 0.9, 1.4), by_hand)


def test_closed_form_satisfies_the_kkt_conditions():
    """Stationarity 2(w_j - p_j) + alpha C_ij - beta S_ij + nu_i - mu_ij = 0 with mu >= 0, mu_ij w_ij = 0."""
    rng = np.random.default_rng(0)
    for n, alpha, beta in itertools.product((2, 3, 6, 15), (0.0, 0.9, 3.0), (0.0, 1.4, 6.0)):
        p, s, c = instance(rng, n)
        w = collaboration_graph(p, s, c, alpha, beta)
        grad = 2 * (w - p[None, :]) + alpha * c - beta * s
        for i in range(n):
            support = w[i] > 1e-12
            nu = -grad[i, support].mean()  # on the support mu = 0, so grad + nu = 0 there
            np.testing.assert_allclose(grad[i, support] + nu, 0.0, atol=1e-10)
            assert (grad[i, ~support] + nu >= -1e-10).all()  # mu >= 0 off the support
        assert (w >= 0).all()
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)


def test_closed_form_is_the_exact_projection_and_cvxpy_is_the_numeric_one():
    """``closed_form`` is the projection itself (bit for bit); ``cvxpy`` agrees with it to 1e-6 but is
    a numeric solve (not bit-identical)."""
    rng = np.random.default_rng(1)
    p, s, c = instance(rng, 5)
    exact = project_rows_to_simplex(qp_targets(p, s, c, 0.9, 1.4))
    np.testing.assert_array_equal(collaboration_graph(p, s, c, 0.9, 1.4), exact)
    np.testing.assert_array_equal(collaboration_graph(p, s, c, 0.9, 1.4, "closed_form"), exact)
    numeric = collaboration_graph(p, s, c, 0.9, 1.4, "cvxpy")
    np.testing.assert_allclose(numeric, exact, atol=1e-6)
    assert not np.array_equal(numeric, exact)


def test_cvxpy_rows_are_renormalised_and_clipped_and_match_kkt():
    """cvxpy's rows: no negative entry, sums exactly 1, each row the projection of its target."""
    rng = np.random.default_rng(2)
    p, s, c = instance(rng, 8)
    w = solve_graph_cvxpy(p, s, c, 2.0, 4.0)  # many zeros: the clipping matters
    assert (w >= 0).all() and (w == 0).any()
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-14)
    np.testing.assert_allclose(w, project_rows_to_simplex(qp_targets(p, s, c, 2.0, 4.0)), atol=1e-7)


def test_simplex_projection_by_hand():
    """(0.5, 0.5) stays; (1, 0.5) -> (0.75, 0.25); (2, 0, -1) -> (1, 0, 0); (0.2, 0.2, 0.2) -> 1/3 each;
    a point on the edge of the support (the threshold equals a coordinate) and a row with ties."""
    points = np.array([[0.5, 0.5, -5.0], [1.0, 0.5, -5.0], [2.0, 0.0, -1.0], [0.2, 0.2, 0.2], [0.8, 0.6, 0.2],
                       [3.0, 3.0, 0.0]])
    expected = np.array([[0.5, 0.5, 0.0], [0.75, 0.25, 0.0], [1.0, 0.0, 0.0], [1 / 3] * 3, [0.6, 0.4, 0.0],
                         [0.5, 0.5, 0.0]])
    np.testing.assert_allclose(project_rows_to_simplex(points), expected, atol=1e-15)
    single = project_rows_to_simplex(np.array([[7.0], [-3.0]]))
    np.testing.assert_array_equal(single, [[1.0], [1.0]])


def test_simplex_projection_matches_a_loop_over_rows_with_bisection():
    """Each row against its own bisection on the threshold tau: w = max(v - tau, 0) with sum w = 1."""
    rng = np.random.default_rng(3)
    points = np.concatenate([rng.normal(0, 1, (6, 5)), rng.normal(0, 5, (6, 5)), rng.normal(0.2, 0.01, (3, 5))])
    projected = project_rows_to_simplex(points)
    for v, w in zip(points, projected):
        lo, hi = v.min() - 1, v.max()
        for _ in range(200):
            tau = (lo + hi) / 2
            lo, hi = (tau, hi) if np.maximum(v - tau, 0).sum() > 1 else (lo, tau)
        np.testing.assert_allclose(w, np.maximum(v - (lo + hi) / 2, 0), atol=1e-12)


def test_graph_by_hand_when_targets_are_already_on_the_simplex():
    """alpha C and beta S that shift every entry of a row by the same amount leave it at p; a row
    whose S favours one client moves weight to it by exactly beta (S_ij - S_ik) / 4 each."""
    p = np.array([0.2, 0.3, 0.5])
    ones = np.ones((3, 3))
    np.testing.assert_allclose(collaboration_graph(p, ones, ones, 0.9, 1.4), np.tile(p, (3, 1)), atol=1e-15)
    s = np.zeros((3, 3))
    s[:, 1] = 0.3  # column 1 more similar: target p + (0, 0.21, 0) shifted by -0.07
    w = collaboration_graph(p, s, np.zeros((3, 3)), 0.0, 1.4)
    np.testing.assert_allclose(w, np.tile([0.2 - 0.07, 0.3 + 0.14, 0.5 - 0.07], (3, 1)), atol=1e-15)
    c = np.zeros((3, 3))
    c[:, 2] = 0.3  # column 2 overlaps more: it loses alpha * 0.3 / 2 before the shift
    w = collaboration_graph(p, np.zeros((3, 3)), c, 0.9, 0.0)
    np.testing.assert_allclose(w, np.tile([0.2 + 0.045, 0.3 + 0.045, 0.5 - 0.09], (3, 1)), atol=1e-15)


# ================================================================= S (Eq. 4)
def test_similarity_by_an_explicit_loop_with_small_norms_and_negative_cosines():
    rng = np.random.default_rng(4)
    v = 0.01 * rng.standard_normal((5, 7))  # norms below 1
    v[2] = -v[0] * 0.5  # cosine -1 with client 0
    s = similarity_matrix(v @ v.T)
    for i, j in itertools.product(range(5), repeat=2):
        expected = 1.0 if i == j else v[i] @ v[j] / np.linalg.norm(v[i]) / np.linalg.norm(v[j])
        assert s[i, j] == pytest.approx(expected, abs=1e-12)
    assert s[0, 2] == pytest.approx(-1.0, abs=1e-12)


def test_similarity_of_a_zero_vector_is_zero_and_its_diagonal_one():
    v = np.array([[1.0, 2.0], [0.0, 0.0], [2.0, 1.0]])
    s = similarity_matrix(v @ v.T)
    np.testing.assert_array_equal(s[1], [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(s[:, 1], [0.0, 1.0, 0.0])
    assert np.isfinite(s).all() and s[0, 2] == pytest.approx(0.8)


def test_similarity_clamp_sets_values_above_it_to_one_and_keeps_the_rest():
    s = np.array([[1.0, 0.9, 0.95, -0.95], [0.9, 1.0, 0.5, 0.2], [0.95, 0.5, 1.0, 0.9 + 1e-9],
                  [-0.95, 0.2, 0.9 + 1e-9, 1.0]])
    clamped = similarity_matrix(s, clamp=0.9)
    expected = s.copy()
    expected[0, 2] = expected[2, 0] = expected[2, 3] = expected[3, 2] = 1.0  # strictly above 0.9
    np.testing.assert_allclose(clamped, expected, atol=1e-12)
    assert clamped[0, 1] == pytest.approx(0.9)  # exactly at the clamp: kept
    np.testing.assert_allclose(similarity_matrix(s, clamp=1.0), s, atol=1e-12)
    np.testing.assert_allclose(similarity_matrix(s), s, atol=1e-12)


def test_similarity_of_a_nearly_parallel_pair_is_clipped_to_one():
    """Rounding can make <v, w> / (|v| |w|) exceed 1: it is clipped into [-1, 1]."""
    gram = np.array([[1.0, 1.0 + 1e-12, -1.0 - 1e-12], [1.0 + 1e-12, 1.0, -1.0], [-1.0 - 1e-12, -1.0, 1.0]])
    s = similarity_matrix(gram)
    assert s[0, 1] == 1.0 and s[0, 2] == -1.0


# ================================================================= C (Eqs. 6-7)
def test_column_cosines_are_every_pair_of_basis_products():
    rng = np.random.default_rng(5)
    bases = rng.standard_normal((3, 6, 2))
    cos = column_cosines(bases)
    for i, j in itertools.product(range(3), repeat=2):
        np.testing.assert_allclose(cos[i, j], bases[i].T @ bases[j], atol=1e-12)


def test_principal_angles_by_an_explicit_loop():
    """Angles by the textbook recursion: the largest cosine over unit vectors of each span, then
    the same on the orthogonal complements of the vectors found (an explicit loop, k steps)."""
    rng = np.random.default_rng(6)
    bases = np.stack([orthonormal(rng, 6, 3) for _ in range(4)])
    angles = principal_angles(bases)
    for i, j in itertools.product(range(4), repeat=2):
        a, b = bases[i].copy(), bases[j].copy()
        loop = []
        for _ in range(3):
            u, sigma, vt = np.linalg.svd(a.T @ b)
            loop.append(np.arccos(min(sigma[0], 1.0)))
            x, y = a @ u[:, 0], b @ vt[0]
            a = a - np.outer(x, x @ a)  # remove the found direction from each span
            b = b - np.outer(y, y @ b)
        np.testing.assert_allclose(angles[i, j], loop, atol=1e-6)


def test_principal_angles_of_a_basis_with_itself_are_zero_not_nan():
    rng = np.random.default_rng(7)
    bases = np.stack([orthonormal(rng, 20, 5) for _ in range(6)])
    angles = principal_angles(np.concatenate([bases, bases]))
    assert np.isfinite(angles).all() and (angles >= 0).all() and (angles <= np.pi / 2 + 1e-12).all()
    for i in range(6):
        np.testing.assert_allclose(angles[i, i + 6], 0.0, atol=1e-6)


def test_complementarity_is_the_cosine_of_the_mean_angle_not_the_mean_cosine():
    """Two planes in R^4 with principal angles 0 and pi/2 (they share e1): C = cos(pi/4), not
    (cos 0 + cos pi/2) / 2 = 0.5."""
    e = np.eye(4)
    t = 0.8
    tilted = np.stack([e[:, 0], np.cos(t) * e[:, 1] + np.sin(t) * e[:, 2]], axis=1)  # angles 0 and t to plane 0
    bases = np.stack([e[:, [0, 1]], e[:, [0, 2]], e[:, [2, 3]], tilted])
    c = complementarity_matrix(bases)
    assert c[0, 1] == pytest.approx(np.cos(np.pi / 4), abs=1e-12)
    assert c[0, 2] == pytest.approx(0.0, abs=1e-12)  # both angles pi/2
    assert c[0, 3] == pytest.approx(np.cos(t / 2), abs=1e-12)
    assert c[0, 3] != pytest.approx((1 + np.cos(t)) / 2, abs=1e-3)


def test_complementarity_by_a_loop_over_pairs_and_k_not_equal_to_n():
    rng = np.random.default_rng(8)
    for n, k in ((3, 2), (2, 3), (4, 4)):
        bases = np.stack([orthonormal(rng, 7, k) for _ in range(n)])
        c = complementarity_matrix(bases)
        for i, j in itertools.product(range(n), repeat=2):
            sigma = np.linalg.svd(bases[i].T @ bases[j], compute_uv=False)
            expected = 1.0 if i == j else np.cos(np.arccos(np.clip(sigma, 0, 1)).mean())
            assert c[i, j] == pytest.approx(expected, abs=1e-7)


def test_greedy_columns_normalise_the_columns_and_match_signed_cosines_by_a_loop():
    """The authors' matching on columns of any length (they normalise), picked greedily by the largest
    signed cosine; C is the cosine of the mean matched angle and symmetric."""
    rng = np.random.default_rng(9)
    bases = rng.standard_normal((3, 5, 3)) * np.array([0.3, 2.0, 5.0])  # columns of unequal length
    angles = greedy_column_angles(bases)
    c = complementarity_matrix(bases, "greedy_columns")
    for i, j in itertools.product(range(3), repeat=2):
        a = bases[i] / np.linalg.norm(bases[i], axis=0)
        b = bases[j] / np.linalg.norm(bases[j], axis=0)
        cos = a.T @ b
        picked = []
        for _ in range(3):
            r, q = divmod(int(np.argmax(cos)), 3)
            picked.append(cos[r, q])
            cos[r, :] = -np.inf
            cos[:, q] = -np.inf
        np.testing.assert_allclose(angles[i, j], np.arccos(np.clip(picked, -1, 1)), atol=1e-12)
        if i != j:
            assert c[i, j] == pytest.approx(np.cos(angles[i, j].mean()), abs=1e-12)
    np.testing.assert_allclose(c, c.T)
    np.testing.assert_array_equal(np.diag(c), 1.0)


def test_greedy_columns_of_identical_and_sign_flipped_bases():
    rng = np.random.default_rng(10)
    u = orthonormal(rng, 30, 4)
    angles = greedy_column_angles(np.stack([u, u, -u]))
    assert np.isfinite(angles).all()
    np.testing.assert_allclose(angles[0, 1], 0.0, atol=1e-7)
    # -u against u: the signed cosines are -I, so the greedy picks the zeros off the diagonal first
    np.testing.assert_allclose(angles[0, 2], np.pi / 2, atol=1e-7)


def test_greedy_angle_of_opposite_columns_whose_cosine_rounds_below_minus_one_is_pi():
    """A computed cosine can fall a few ulps under -1; clipped, its angle is pi, not NaN."""
    rng = np.random.default_rng(0)
    for _ in range(100):  # the first opposite pair (k = 1) whose rounded cosine is under -1
        u = rng.standard_normal((7, 1))
        bases = np.stack([u, -u])
        cos = column_cosines(bases / np.linalg.norm(bases, axis=1, keepdims=True))[0, 1, 0, 0]  # as the rule does
        if cos < -1.0:
            break
    assert cos < -1.0
    angles = greedy_column_angles(bases)
    assert np.isfinite(angles).all() and angles[0, 1, 0] == np.pi


def test_complementarity_standard_mode_ignores_column_signs_greedy_mode_does_not():
    rng = np.random.default_rng(11)
    u = orthonormal(rng, 6, 2)
    flipped = u * np.array([1.0, -1.0])
    bases = np.stack([u, flipped])
    assert complementarity_matrix(bases)[0, 1] == pytest.approx(1.0, abs=1e-7)
    assert complementarity_matrix(bases, "standard")[0, 1] == pytest.approx(1.0, abs=1e-7)
    assert complementarity_matrix(bases, "greedy_columns")[0, 1] == pytest.approx(np.cos(np.pi / 2), abs=1e-7)


# ================================================================= the alpha schedule
@pytest.mark.parametrize("boundary", ["paper", "code"])
def test_alpha_schedule_at_its_boundary_rounds(boundary):
    """T = 10, fraction 0.7: paper on for t = 0..6 (Flower rounds 1..7), code also t = 7 (round 8);
    T = 20, fraction 0.5: paper rounds 1..10, code 1..11; fraction 0: never (paper) / only t = 0 (code)."""
    on = lambda T, f: [r for r in range(1, T + 1) if alpha_at(r, T, 0.9, f, boundary) == 0.9]  # noqa: E731
    extra = 1 if boundary == "code" else 0
    assert on(10, 0.7) == list(range(1, 8 + extra))
    assert on(20, 0.5) == list(range(1, 11 + extra))
    assert on(4, 1.0) == [1, 2, 3, 4]
    assert on(5, 0.0) == ([1] if boundary == "code" else [])
    for r in range(1, 21):
        assert alpha_at(r, 20, 0.9, 0.5, boundary) in (0.9, 0.0)
    assert alpha_at(20, 20, 0.9, 0.5, boundary) == 0.0 and alpha_at(1, 20, 0.3, 0.5, boundary) == 0.3


def test_alpha_schedule_defaults_are_the_paper_boundary_at_seventy_percent():
    assert [alpha_at(r, 10, 0.5) for r in range(1, 11)] == [0.5] * 7 + [0.0] * 3
    assert [alpha_at(r, 50, 1.0) for r in (35, 36)] == [1.0, 0.0]


# ================================================================= graph diagnostics (issue #30)
def test_graph_diagnostics_by_hand():
    """W = [[1, 0], [0.5, 0.5]], p = (0.25, 0.75): self-weight (1 + 0.5)/2; entropy (0 + ln 2)/2;
    |W - p| row sums 1.5 and 0.5; off-diagonal S (0.2, 0.6): mean 0.4, std 0.2."""
    w = np.array([[1.0, 0.0], [0.5, 0.5]])
    s = np.array([[1.0, 0.2], [0.6, 1.0]])
    c = np.array([[1.0, 0.1], [0.1, 1.0]])
    d = graph_diagnostics(w, np.array([0.25, 0.75]), s, c)
    assert d == pytest.approx({"self-weight": 0.75, "row-entropy": np.log(2) / 2, "dist-to-p": 1.0, "similarity": 0.4,
                               "similarity-std": 0.2, "complementarity": 0.1, "complementarity-std": 0.0}, abs=1e-12)
    assert set(graph_diagnostics(w, np.array([0.25, 0.75]), s)) == {"self-weight", "row-entropy", "dist-to-p",
                                                                    "similarity", "similarity-std"}
    uniform = graph_diagnostics(np.full((4, 4), 0.25), np.full(4, 0.25), np.eye(4))
    assert uniform["row-entropy"] == pytest.approx(np.log(4)) and uniform["dist-to-p"] == 0.0


# ================================================================= aggregation
def test_aggregation_rounds_integer_tensors_and_mixes_every_float_tensor():
    w = np.array([[0.7, 0.3], [0.2, 0.8]])
    counters = np.array([10, 11], dtype=np.int64)  # 0.7*10 + 0.3*11 = 10.3 -> 10; 0.2*10 + 0.8*11 = 10.8 -> 11
    mixed = aggregate_by_graph(w, counters)
    assert mixed.dtype == np.int64
    np.testing.assert_array_equal(mixed, [10, 11])
    np.testing.assert_array_equal(aggregate_by_graph(np.array([[0.4, 0.6], [0.5, 0.5]]), np.array([[1], [2]])),
                                  [[2], [2]])  # 1.6 -> 2 (truncation would give 1); 1.5 -> 2
    floats = np.array([[[1.0, 2.0]], [[3.0, 5.0]]], dtype=np.float64)
    np.testing.assert_allclose(aggregate_by_graph(w, floats), [[[1.6, 2.9]], [[2.6, 4.4]]], atol=1e-15)
    half = aggregate_by_graph(w, floats.astype(np.float32))
    assert half.dtype == np.float32 and half.shape == (2, 1, 2)



def test_aggregation_writes_the_product_into_the_given_out_array():
    """``out`` given (a float tensor's (n, size) buffer): the product is written there and returned as a view
    of it, for any shape of the stacked tensor; without it a new array comes back."""
    rng = np.random.default_rng(40)
    w = rng.dirichlet(np.ones(3), size=3)
    stacked = rng.standard_normal((3, 2, 4)).astype(np.float32)
    expected = np.einsum("ij,jkl->ikl", w, stacked.astype(np.float64))
    out = np.full((3, 8), np.nan, np.float32)
    mixed = aggregate_by_graph(w, stacked, out)
    assert mixed.shape == (3, 2, 4) and mixed.dtype == np.float32 and np.shares_memory(mixed, out)
    np.testing.assert_allclose(out.reshape(3, 2, 4), expected, rtol=1e-5, atol=1e-6)
    fresh = aggregate_by_graph(w, stacked)
    assert not np.shares_memory(fresh, out)
    np.testing.assert_array_equal(fresh, mixed)

# ================================================================= the client: regulariser and subspace
def test_paper_regulariser_value_is_minus_lambda_cosine_to_the_reference():
    model = torch.nn.Linear(3, 2)
    theta = parameters_to_vector(model.parameters()).detach()
    reference = torch.randn_like(theta)
    expected = -0.3 * float(theta @ reference / theta.norm() / reference.norm())
    assert regulariser("paper", 0.3, reference)(model).item() == pytest.approx(expected, rel=1e-6)
    assert regulariser("paper", 0.3, -reference)(model).item() == pytest.approx(-expected, rel=1e-6)


def test_a_step_on_ce_minus_lambda_cos_lowers_it_and_moves_towards_the_reference():
    """One small SGD step on CE - lambda cos(theta, ref) lowers that loss, raises the cosine to ref
    (with CE off) and never touches ref; with a large lambda, the cosine rises even with CE on."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    reference = torch.randn(parameters_to_vector(model.parameters()).numel())
    kept = reference.clone()
    reg = regulariser("paper", 5.0, reference)
    loss = lambda m: F.cross_entropy(m(x), y) + reg(m)  # noqa: E731
    cos = lambda m: float(F.cosine_similarity(parameters_to_vector(m.parameters()), reference, dim=0))  # noqa: E731
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before, cos_before = loss(model).item(), cos(model)
    opt.zero_grad()
    loss(model).backward()
    opt.step()
    assert loss(model).item() < before and cos(model) > cos_before
    assert torch.equal(reference, kept)


def test_authors_regulariser_gradient_is_lambda_times_the_projected_reference():
    """d/dtheta lambda <c, theta>/|theta| = lambda (c - <c, t> t) / |theta|, t = theta/|theta|."""
    model = torch.nn.Linear(3, 2)
    theta = parameters_to_vector(model.parameters()).detach()
    c = torch.randn_like(theta)
    value = regulariser("authors", 0.7, c)(model)
    value.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    t = theta / theta.norm()
    np.testing.assert_allclose(wire.to_host(grad), wire.to_host((0.7 * (c - (c @ t) * t) / theta.norm())), rtol=1e-5, atol=1e-7)
    assert value.item() == pytest.approx(0.7 * float(c @ theta) / float(theta.norm()), rel=1e-6)
    with pytest.raises(ValueError, match="unknown regulariser"):
        regulariser("other", 0.7, c)


def test_subspace_basis_top_k_by_hand_and_centring():
    """Features along e1 (scale 5) and e2 (scale 2) plus an offset along e3: the plain SVD's top
    direction is the offset e3 (Eq. 5, no centring); centred (the authors' PCA) it is e1, then e2."""
    rng = np.random.default_rng(12)
    n = 400
    a, b = rng.standard_normal(n), rng.standard_normal(n)
    a, b = a - a.mean(), b - b.mean()
    b -= (a @ b) / (a @ a) * a  # uncorrelated: the singular directions are exactly e3, e1, e2
    x = np.zeros((n, 4))
    x[:, 0], x[:, 1], x[:, 2] = 5 * a, 2 * b, 20.0
    features = torch.tensor(x)
    plain = subspace_basis(features, 2)
    np.testing.assert_allclose(np.abs(plain[:, 0]), [0, 0, 1, 0], atol=1e-3)
    np.testing.assert_allclose(np.abs(plain[:, 1]), [1, 0, 0, 0], atol=1e-6)
    centred = subspace_basis(features, 2, center=True)
    np.testing.assert_allclose(np.abs(centred), np.eye(4)[:, :2], atol=1e-6)
    np.testing.assert_allclose(subspace_basis(features, 2, False), plain)
    one = subspace_basis(features, 1)
    assert one.shape == (4, 1) and one[2, 0] > 0  # the sign rule: the largest entry is positive


def test_subspace_basis_is_computed_in_float64_from_float32_features():
    """Singular values 3, 2, 1.001, 1: the top-3 subspace is 1e-3 from the next direction, so a
    float32 SVD would be off by ~1e-4; from the same float32 features in float64 it is exact."""
    rng = np.random.default_rng(25)
    u = np.linalg.qr(rng.standard_normal((200, 4)))[0]
    v = np.linalg.qr(rng.standard_normal((6, 4)))[0]
    features = torch.tensor(u @ np.diag([3.0, 2.0, 1.001, 1.0]) @ v.T, dtype=torch.float32)
    top = np.linalg.svd(wire.to_host(features).astype(np.float64))[2][:3].T
    basis = subspace_basis(features, 3).astype(np.float64)
    np.testing.assert_allclose(basis @ basis.T, top @ top.T, atol=1e-6)


def test_subspace_basis_signs_and_zero_columns():
    """-x gives the same basis (signs are fixed by the largest entry); zero features give the SVD's
    own orthonormal basis, still positive on its largest entries."""
    rng = np.random.default_rng(13)
    x = torch.tensor(rng.standard_normal((30, 5)))
    np.testing.assert_allclose(subspace_basis(-x, 3), subspace_basis(x, 3), atol=1e-6)
    zero = subspace_basis(torch.zeros(1, 3), 3)  # one sample, three directions: the full V
    np.testing.assert_allclose(zero.T @ zero, np.eye(3), atol=1e-6)
    assert (zero[np.abs(zero).argmax(0), np.arange(3)] > 0).all()
    two = subspace_basis(torch.tensor([[3.0, 0.0, 0.0], [0.0, -2.0, 0.0]]), 3)
    np.testing.assert_allclose(two, np.eye(3), atol=1e-6)  # signs flipped positive, the third from the full V


# ================================================================= the strategy on a tiny model
TINY = {"body.w": np.arange(6, dtype=np.float32).reshape(2, 3) / 10, "body.bn.running_mean": np.zeros(3, np.float32),
        "body.bn.running_var": np.ones(3, np.float32), "body.bn.num_batches_tracked": np.array(4, np.int64),
        "head.b": np.array([0.5, -0.5], np.float32)}


def tiny_strategy(n=3, rounds=10, weights=None, feature_dim=4, run=None, **hp):
    config = {"method": "fedsac", "dataset": "digits", "model": "simplecnn", "num-server-rounds": rounds,
              "fedsac.k": 2, **(run or {}), **{f"fedsac.{k}": v for k, v in hp.items()}}
    facts = ModelFacts("tiny", (1, 8, 8), 2, feature_dim, dict(weights or TINY))
    return FedSaCStrategy(Config.from_run_config(config), fake_clients(n, 2), facts)


def tiny_reply(strategy, pid, weights, basis, n=100):
    return ClientReply(pid, strategy.node_of[pid], n, {}, {
        wire.WEIGHTS: {k: np.asarray(v, dtype=strategy.initial_weights[k].dtype) for k, v in weights.items()},
        SUBSPACE: {BASIS: np.asarray(basis, dtype=np.float32)}})


def tiny_round(strategy, rng, pids, sizes=None, scale=0.1, server_round=1):
    weights = {pid: {k: (v + scale * rng.standard_normal(v.shape) if v.dtype.kind == "f" else v + pid)
                     for k, v in strategy.initial_weights.items()} for pid in pids}
    bases = {pid: orthonormal(rng, strategy.model.feature_dim, strategy.hp["k"]) for pid in pids}
    sizes = sizes or [50 + 25 * i for i in range(len(pids))]
    replies = [tiny_reply(strategy, pid, weights[pid], bases[pid], m) for pid, m in zip(pids, sizes)]
    return replies, strategy.aggregate(server_round, replies)


def vectors(replies, strategy, minus_init=True, keys=("body.w", "head.b")):
    return np.stack([np.concatenate([(r.arrays[wire.WEIGHTS][k].astype(np.float64)
                                      - (strategy.initial_weights[k] if minus_init else 0)).ravel() for k in keys])
                     for r in replies])


def expected_graph(strategy, replies, server_round, minus_init=True, alpha=None):
    """W recomputed from scratch: p from n_i, S from the parameter vectors, C from the bases."""
    n = np.array([r.num_examples for r in replies], float)
    v = vectors(replies, strategy, minus_init)
    s = similarity_matrix(v @ v.T, strategy.hp["sim-clamp"])
    c = complementarity_matrix(np.stack([r.arrays[SUBSPACE][BASIS] for r in replies]).astype(float),
                               strategy.hp["angles"])
    a = alpha if alpha is not None else alpha_at(server_round, strategy.cfg["num-server-rounds"], strategy.hp["alpha"],
                                                 strategy.hp["alpha-fraction"], strategy.hp["alpha-boundary"])
    return collaboration_graph(n / n.sum(), s, c, a, strategy.hp["beta"]), s, c


def test_is_parameter_excludes_batchnorm_statistics_only():
    assert is_parameter("body.w") and is_parameter("head.b") and is_parameter("running")
    assert not any(is_parameter(k) for k in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"))


@pytest.mark.parametrize("sim_vector", ["delta_init", "params"])
def test_strategy_graph_similarity_and_complementarity_recomputed_from_scratch(sim_vector):
    """S over trained parameters only (BatchNorm statistics left out), from theta_j - theta(0) or from
    theta_j; p from the reply sizes; every tensor mixed by W (integer counters rounded)."""
    rng = np.random.default_rng(14)
    strategy = tiny_strategy(4, **{"sim-vector": sim_vector})
    replies, metrics = tiny_round(strategy, rng, [0, 1, 2, 3], sizes=[10, 30, 20, 40])
    w, s, c = expected_graph(strategy, replies, 1, minus_init=sim_vector == "delta_init")
    np.testing.assert_allclose(strategy.round_matrices["similarity"], s, atol=1e-6)
    np.testing.assert_allclose(strategy.round_matrices["complementarity"], c, atol=1e-6)
    np.testing.assert_allclose(strategy.round_matrices["graph"], w, atol=1e-6)
    np.testing.assert_allclose(strategy.graph, w, atol=1e-6)
    np.testing.assert_array_equal(strategy.round_matrices["pids"], [0, 1, 2, 3])
    for i in range(4):
        mixed = strategy.personal_weights(i)
        assert list(mixed) == list(TINY)
        for key in TINY:
            stacked = np.stack([r.arrays[wire.WEIGHTS][key].astype(np.float64) for r in replies])
            manual = np.tensordot(w[i], stacked, axes=1)
            if TINY[key].dtype.kind == "f":
                np.testing.assert_allclose(mixed[key], manual, rtol=1e-5, atol=1e-6)
            else:
                assert mixed[key] == np.rint(manual)
            assert mixed[key].dtype == TINY[key].dtype
    off = ~np.eye(4, dtype=bool)
    p = np.array([10, 30, 20, 40]) / 100
    rows = [(-sum(x * np.log(x) for x in row if x > 0), sum(abs(x - q) for x, q in zip(row, p))) for row in w]
    assert metrics == pytest.approx({"alpha": 0.9, "self-weight": np.diag(w).mean(), "similarity": s[off].mean(),
                                     "complementarity": c[off].mean(), "similarity-std": s[off].std(),
                                     "complementarity-std": c[off].std(), "row-entropy": np.mean([e for e, _ in rows]),
                                     "dist-to-p": np.mean([d for _, d in rows])}, abs=1e-6)
    assert strategy.num_examples == {0: 10, 1: 30, 2: 20, 3: 40}


def test_strategy_similarity_ignores_batchnorm_statistics():
    """Replies that differ only in their running statistics have the same S as without them."""
    rng = np.random.default_rng(15)
    strategy = tiny_strategy(3)
    replies, _ = tiny_round(strategy, rng, [0, 1, 2])
    s = strategy.round_matrices["similarity"].copy()
    for r in replies:
        r.arrays[wire.WEIGHTS]["body.bn.running_mean"] = (100 * rng.standard_normal(3)).astype(np.float32)
        r.arrays[wire.WEIGHTS]["body.bn.running_var"] = (100 * rng.random(3)).astype(np.float32)
    again = tiny_strategy(3)
    again.aggregate(1, replies)
    np.testing.assert_allclose(again.round_matrices["similarity"], s, atol=1e-12)


def test_gram_in_column_blocks_equals_one_product(monkeypatch):
    """The Gram matrix in blocks of a few columns (block edges inside every tensor) equals V V^T."""
    rng = np.random.default_rng(16)
    weights = {"a": rng.standard_normal((5, 3)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float32),
               "c.num_batches_tracked": np.array(1, np.int64)}
    for sim_vector in ("delta_init", "params"):
        strategy = tiny_strategy(4, weights=weights, **{"sim-vector": sim_vector})
        stacks = {k: np.stack([v + rng.standard_normal(v.shape).astype(v.dtype) if v.dtype.kind == "f" else v
                               for _ in range(4)]) for k, v in weights.items()}
        init = np.concatenate([weights[k].ravel() for k in ("a", "b")]) if sim_vector == "delta_init" else 0
        v = np.stack([np.concatenate([stacks[k][i].ravel() for k in ("a", "b")]) for i in range(4)]) - init
        states = [{k: stacks[k][i] for k in stacks} for i in range(4)]  # as the replies' views come
        whole = strategy.gram(states)
        np.testing.assert_allclose(whole, v @ v.T, rtol=1e-5)
        monkeypatch.setattr(fedsac_module, "GRAM_BLOCK", 12)  # 3 columns a block at n = 4
        np.testing.assert_allclose(strategy.gram(states), v @ v.T, rtol=1e-5)
        monkeypatch.setattr(fedsac_module, "GRAM_BLOCK", 2)  # fewer values than clients: 1 column a block
        np.testing.assert_allclose(strategy.gram(states), v @ v.T, rtol=1e-5)
        monkeypatch.undo()
        before = {k: stacks[k].copy() for k in stacks}
        strategy.gram(states)
        for k in stacks:  # the states are not changed in place
            np.testing.assert_array_equal(stacks[k], before[k])


def mixing_case(rng):
    """Three tensors (one an integer counter), a 4-client strategy, 4 clients' states around them and a W."""
    weights = {"a": rng.standard_normal((5, 3)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float32),
               "c.num_batches_tracked": np.array(4, np.int64)}
    strategy = tiny_strategy(4, weights=weights)
    states = [{k: (v + rng.standard_normal(v.shape).astype(v.dtype)) if v.dtype.kind == "f" else v + i
               for k, v in weights.items()} for i in range(4)]
    return weights, strategy, states, rng.dirichlet(np.ones(4), size=4)


def test_mixing_in_column_blocks_writes_each_clients_record_as_one_product(monkeypatch):
    """theta~_i = sum_j W_ij theta_j, written block by block into each client's packed record, equals the
    whole product, for block edges inside every tensor; integer counters are rounded back."""
    rng = np.random.default_rng(17)
    weights, strategy, states, w = mixing_case(rng)
    for block in (1 << 24, 12, 2):
        monkeypatch.setattr(fedsac_module, "GRAM_BLOCK", block)
        records = strategy.mixed_records(w, states, list(weights))
        for i, record in enumerate(records):
            got = wire.unpack_arrays(record)
            for k, v in weights.items():
                expected = sum(w[i, j] * states[j][k].astype(np.float64) for j in range(4))
                if v.dtype.kind != "f":
                    expected = np.rint(expected)
                assert got[k].dtype == v.dtype and got[k].shape == v.shape
                np.testing.assert_allclose(got[k], expected, rtol=1e-5, atol=1e-6)


def test_mixing_blocks_cover_every_column_once_and_write_into_reused_scratch(monkeypatch):
    """mixed_records' column blocks: each holds at most GRAM_BLOCK values (one column when a column alone
    is more), together they cover every value of every tensor exactly once, and on the CPU each float
    block's product is written into the scratch reused block after block: torch allocates nothing while
    the records are mixed (a fresh product per block would be GRAM_BLOCK values a block at scale)."""
    from torch.autograd.profiler import profile

    from fedstrategies import server_device

    rng = np.random.default_rng(41)
    weights, strategy, states, w = mixing_case(rng)
    blocks = []

    def spy(graph, stacked, out=None):  # the real product, its block shapes noted
        blocks.append(stacked.shape)
        return aggregate_by_graph(graph, stacked, out)

    monkeypatch.setattr(fedsac_module, "aggregate_by_graph", spy)
    for block in (1 << 24, 12, 2):
        monkeypatch.setattr(fedsac_module, "GRAM_BLOCK", block)
        blocks.clear()
        with profile(profile_memory=True) as prof:  # torch's CPU allocations (numpy's are not counted)
            records = strategy.mixed_records(w, states, list(weights))
        assert all(rows == 4 and rows * cols <= max(block, 4) for rows, cols in blocks)
        assert sum(cols for _, cols in blocks) == sum(v.size for v in weights.values())
        if server_device.current().type == "cpu":
            assert sum(max(e.cpu_memory_usage, 0) for e in prof.function_events) == 0
        for i, record in enumerate(records):
            got = wire.unpack_arrays(record)
            np.testing.assert_allclose(got["a"], sum(w[i, j] * states[j]["a"] for j in range(4)), rtol=1e-5, atol=1e-6)

def test_strategy_passes_clamp_angles_and_alpha_schedule_options_to_the_math():
    rng = np.random.default_rng(17)
    strategy = tiny_strategy(3, rounds=10, alpha=0.6, beta=2.0, **{"sim-clamp": 0.1, "angles": "greedy_columns",
                                                                   "alpha-fraction": 0.5, "alpha-boundary": "code"})
    for server_round, alpha in ((5, 0.6), (6, 0.6), (7, 0.0)):
        replies, metrics = tiny_round(strategy, rng, [0, 1, 2], server_round=server_round)
        assert metrics["alpha"] == alpha
        w, s, c = expected_graph(strategy, replies, server_round, alpha=alpha)
        np.testing.assert_allclose(strategy.round_matrices["similarity"], s, atol=1e-6)
        np.testing.assert_allclose(strategy.round_matrices["complementarity"], c, atol=1e-6)
        np.testing.assert_allclose(strategy.graph, w, atol=1e-6)
    paper = tiny_strategy(3, rounds=10, **{"alpha-fraction": 0.5})
    assert tiny_round(paper, rng, [0, 1, 2], server_round=6)[1]["alpha"] == 0.0


def test_strategy_with_cvxpy_solver_gives_the_same_graph():
    rng = np.random.default_rng(18)
    a, b = tiny_strategy(3), tiny_strategy(3, solver="cvxpy")
    replies, _ = tiny_round(a, rng, [0, 1, 2])
    b.aggregate(1, replies)
    np.testing.assert_allclose(b.graph, a.graph, atol=1e-6)
    assert not np.array_equal(b.graph, a.graph)  # a numeric solve, not the projection


def test_one_client_round_and_graph_block_update_across_rounds():
    """A round of one client: W = [[1]], it keeps its own model, metrics say 1.0 for S and C. Then a
    round of clients {1, 2} writes only their block; client 0's row and model stay."""
    rng = np.random.default_rng(19)
    strategy = tiny_strategy(3)
    assert np.array_equal(strategy.graph, np.zeros((3, 3)))
    replies, metrics = tiny_round(strategy, rng, [0])
    np.testing.assert_array_equal(strategy.graph, [[1, 0, 0], [0, 0, 0], [0, 0, 0]])
    assert metrics["similarity"] == 1.0 and metrics["complementarity"] == 1.0 and metrics["self-weight"] == 1.0
    assert metrics["similarity-std"] == 0.0 and metrics["row-entropy"] == 0.0 and metrics["dist-to-p"] == 0.0
    for k, v in strategy.personal_weights(0).items():
        np.testing.assert_allclose(v, replies[0].arrays[wire.WEIGHTS][k], rtol=1e-6)
    model0 = {k: np.array(v) for k, v in strategy.personal_weights(0).items()}
    replies, _ = tiny_round(strategy, rng, [1, 2], server_round=2)
    w, _, _ = expected_graph(strategy, replies, 2)
    np.testing.assert_allclose(strategy.graph[1:, 1:], w, atol=1e-6)
    assert strategy.graph[0, 0] == 1 and (strategy.graph[0, 1:] == 0).all() and (strategy.graph[1:, 0] == 0).all()
    for k, v in strategy.personal_weights(0).items():
        np.testing.assert_array_equal(v, model0[k])
    assert strategy.num_examples == {0: 50, 1: 50, 2: 75}


def test_messages_carry_theta0_then_the_mixed_model_and_the_regulariser_mode():
    rng = np.random.default_rng(20)
    strategy = tiny_strategy(3)
    for pid in range(3):
        for payload in (strategy.train_payload(pid, 1), strategy.evaluate_payload(pid, 1)):
            assert set(payload) == {wire.WEIGHTS}
            got = wire.unpack_arrays(payload[wire.WEIGHTS])
            assert all(np.array_equal(got[k], TINY[k]) for k in TINY)
        assert strategy.train_config(pid, 1) == {REGULARISER: "off"}
    tiny_round(strategy, rng, [0, 2])
    for pid in (0, 2):
        assert strategy.train_payload(pid, 2)[wire.WEIGHTS] is strategy.personal[pid]
        assert strategy.evaluate_payload(pid, 2)[wire.WEIGHTS] is strategy.personal[pid]
        assert strategy.train_config(pid, 2) == {REGULARISER: "paper"}
    assert strategy.train_config(1, 2) == {REGULARISER: "off"}
    theta0 = strategy.personal_record(1)  # theta(0), one record packed once
    assert theta0 is strategy.personal_record(1) and all(
        np.array_equal(v, strategy.initial_weights[k]) for k, v in wire.unpack_arrays(theta0).items())
    assert strategy.references == {}  # the paper's regulariser needs no reference


def test_authors_mode_references_by_a_loop_including_small_norm_models():
    """c_i = sum_j W_ij theta_j / |theta_j| over trained parameters only, sent only after a client's
    first aggregation; models of norm < 1 are divided by their own norm (no floor at 1)."""
    rng = np.random.default_rng(21)
    small = {k: (v / 100 if v.dtype.kind == "f" else v) for k, v in TINY.items()}
    strategy = tiny_strategy(3, weights=small, regulariser="authors")
    assert set(strategy.train_payload(0, 1)) == {wire.WEIGHTS}
    replies, _ = tiny_round(strategy, rng, [0, 1], scale=0.001)
    thetas = vectors(replies, strategy, minus_init=False)
    assert (np.linalg.norm(thetas, axis=1) < 1).all()
    for i, pid in enumerate((0, 1)):
        payload = strategy.train_payload(pid, 2)
        assert set(payload) == {wire.WEIGHTS, REFERENCE}
        reference = wire.unpack_arrays(payload[REFERENCE])
        assert set(reference) == {"body.w", "head.b"}
        got = np.concatenate([reference[k].ravel() for k in ("body.w", "head.b")])
        manual = sum(strategy.graph[pid, j] * thetas[j] / np.linalg.norm(thetas[j]) for j in range(2))
        np.testing.assert_allclose(got, manual, rtol=1e-5)
        assert strategy.train_config(pid, 2) == {REGULARISER: "authors"}
    assert set(strategy.train_payload(2, 2)) == {wire.WEIGHTS}
    assert strategy.train_config(2, 2) == {REGULARISER: "off"}



def test_authors_references_of_a_one_client_round_and_of_norms_a_float32_sum_would_round():
    """c_i = sum_j W_ij theta_j / |theta_j|: a round of one client gets its own theta / |theta|; |theta_j| is
    summed in float64 (in float32, 64 entries of 4096 and 65,536 of 1 lose every 1: 6e-5 of |theta|^2),
    checked against the float64 formula."""
    rng = np.random.default_rng(44)
    strategy = tiny_strategy(3, regulariser="authors")
    replies, _ = tiny_round(strategy, rng, [1])
    theta = vectors(replies, strategy, minus_init=False)[0]
    got = wire.unpack_arrays(strategy.train_payload(1, 2)[REFERENCE])
    np.testing.assert_allclose(np.concatenate([got[k].ravel() for k in ("body.w", "head.b")]),
                               theta / np.linalg.norm(theta), rtol=1e-6)
    wide = {"w": np.concatenate([np.full(64, 4096, np.float32), np.ones(1 << 16, np.float32)]),
            "b": np.full(3, 2.0, np.float32), "bn.running_var": np.full(3, 1e6, np.float32)}
    strategy = tiny_strategy(2, weights=wide, regulariser="authors")
    states = [wide, {k: v * np.float32(0.5) + 1 for k, v in wide.items()}]
    w = np.array([[0.6, 0.4], [0.3, 0.7]])
    thetas = [np.concatenate([s[k].astype(np.float64) for k in ("w", "b")]) for s in states]
    for i, record in enumerate(strategy.authors_references(w, states)):
        got = wire.unpack_arrays(record)
        assert set(got) == {"w", "b"}  # BatchNorm statistics are neither mixed nor counted in |theta|
        expected = sum(w[i, j] * thetas[j] / np.linalg.norm(thetas[j]) for j in range(2))
        np.testing.assert_allclose(np.concatenate([got["w"], got["b"]]), expected, rtol=1e-6)

def test_check_reply_bounds():
    rng = np.random.default_rng(22)
    strategy = tiny_strategy(2)
    basis = orthonormal(rng, 4, 2)
    ok = tiny_reply(strategy, 0, TINY, basis, n=1)
    assert strategy.check_reply(ok) is None
    assert "positive" in strategy.check_reply(tiny_reply(strategy, 0, TINY, basis, n=0))
    assert "positive" in strategy.check_reply(tiny_reply(strategy, 0, TINY, basis, n=-3))
    off = basis.copy()
    off[:, 1] *= 1.0004  # |U^T U - I| = 8e-4: within the tolerance
    assert strategy.check_reply(tiny_reply(strategy, 0, TINY, off)) is None
    off[:, 1] *= 1.001  # 2.8e-3: refused
    assert "not orthonormal" in strategy.check_reply(tiny_reply(strategy, 0, TINY, off))
    nan = basis.copy()
    nan[0, 0] = np.nan
    assert "not orthonormal" in strategy.check_reply(tiny_reply(strategy, 0, TINY, nan))
    assert strategy.reply_schema(0) == {wire.WEIGHTS: strategy.reply_schema(1)[wire.WEIGHTS], SUBSPACE: {BASIS: (4, 2)}}


def test_k_up_to_the_feature_dimension():
    assert tiny_strategy(2, feature_dim=2).hp["k"] == 2
    with pytest.raises(ValueError, match="exceeds the feature dimension"):
        tiny_strategy(2, feature_dim=1)


def test_checkpoint_restores_theta0_for_clients_never_aggregated():
    rng = np.random.default_rng(23)
    strategy = tiny_strategy(3, regulariser="authors")
    tiny_round(strategy, rng, [0, 1])
    restored = tiny_strategy(3, weights={k: v + 1 if v.dtype.kind == "f" else v for k, v in TINY.items()},
                             regulariser="authors")
    restored.load_state_dict(strategy.state_dict())
    got = wire.unpack_arrays(restored.personal_record(2))  # theta(0) of the checkpoint, not of the new strategy
    assert all(np.array_equal(got[k], TINY[k]) for k in TINY)
    assert restored.references.keys() == {0, 1} and restored.num_examples == strategy.num_examples



def test_graph_rows_are_the_blocks_written_so_far_each_column_once():
    """write_block(pids, B) is W[pids, pids] = B on the N x N matrix: row i keeps its weights to clients
    outside pids and holds every column a round wrote exactly once (zero weights included), in
    partition-id order; the matrix rebuilt from the rows is W. Checked against W and a mask of the written
    entries kept by hand over overlapping rounds with unsorted pids."""
    rng = np.random.default_rng(42)
    strategy = tiny_strategy(6)
    dense, written = np.zeros((6, 6)), np.zeros((6, 6), bool)
    for pids in ([3, 0, 2], [2, 5], [5, 3, 0, 1], [4], [1, 2, 3]):
        block = rng.dirichlet(np.ones(len(pids)), size=len(pids))
        block[block < 0.2] = 0.0  # the simplex projection leaves exact zeros: they are written too
        strategy.write_block(pids, block)
        dense[np.ix_(pids, pids)], written[np.ix_(pids, pids)] = block, True
        assert set(strategy.graph_rows) == set(np.flatnonzero(written.any(axis=1)).tolist())
        for pid, (cols, weights) in strategy.graph_rows.items():
            np.testing.assert_array_equal(cols, np.flatnonzero(written[pid]))
            np.testing.assert_array_equal(weights, dense[pid, cols])
        np.testing.assert_array_equal(strategy.graph, dense)


def test_a_dense_checkpoint_of_an_older_version_loads_as_the_rows_it_was_written_from():
    """A checkpoint written before graph_rows holds W as an N x N matrix ("graph"): it loads to the same W,
    one row per client a round wrote (the non-zero entries, their partition ids as int64), the same
    personal models, and the run goes on from it exactly as from the checkpoint of today."""
    from server_app import checkpoints

    rng = np.random.default_rng(43)
    strategy = tiny_strategy(5)
    tiny_round(strategy, rng, [0, 1, 2])
    tiny_round(strategy, rng, [2, 3], server_round=2)  # client 4 is never aggregated: no row
    state = strategy.state_dict()
    old = {"method": {**{k: v for k, v in state["method"].items() if k != "graph_rows"}, "graph": strategy.graph},
           "base": state["base"]}
    restored = tiny_strategy(5)
    restored.load_state_dict(checkpoints.loads(checkpoints.dumps({"round": 2, "strategy": old}))["strategy"])
    dense = strategy.graph
    assert set(restored.graph_rows) == {0, 1, 2, 3}
    for pid, (cols, weights) in restored.graph_rows.items():
        assert cols.dtype == np.int64
        np.testing.assert_array_equal(cols, np.flatnonzero(dense[pid]))
        np.testing.assert_array_equal(weights, dense[pid][dense[pid] != 0])
    np.testing.assert_array_equal(restored.graph, dense)
    for pid in range(5):
        assert restored.personal_record(pid).keys() == strategy.personal_record(pid).keys()
        for k, v in strategy.personal_weights(pid).items():
            np.testing.assert_array_equal(restored.personal_weights(pid)[k], v)
    replies, _ = tiny_round(strategy, rng, [1, 3], server_round=3)
    restored.aggregate(3, replies)
    np.testing.assert_array_equal(restored.graph, strategy.graph)
    for pid in range(5):
        for k, v in strategy.personal_weights(pid).items():
            np.testing.assert_array_equal(restored.personal_weights(pid)[k], v)

def test_example_reply_passes_the_checks_and_is_empty_for_evaluate():
    """The benchmark's reply: theta(0) plus N(0, 0.01^2) noise on every float entry, counters as they are."""
    big = {**TINY, "body.big": np.zeros((50, 40), np.float32), "body.counts": np.full(50, 4, np.int64)}
    strategy = tiny_strategy(2, weights=big)
    rng = np.random.default_rng(24)
    reply = example_reply(strategy, 0, "train", rng)
    assert set(reply) == {wire.WEIGHTS, SUBSPACE}
    weights = wire.unpack_arrays(reply[wire.WEIGHTS])
    for k, v in big.items():
        assert weights[k].dtype == v.dtype and weights[k].shape == v.shape
        if v.dtype.kind == "f":
            assert 0 < np.abs(weights[k] - v).max() < 0.06 and len(np.unique(weights[k] - v)) == v.size
        else:
            np.testing.assert_array_equal(weights[k], v)
    noise = weights["body.big"]
    assert 0.009 < noise.std() < 0.011 and abs(noise.mean()) < 0.001
    basis = wire.unpack_arrays(reply[SUBSPACE])[BASIS]
    assert basis.shape == (4, 2) and basis.dtype == np.float32
    arrays = {name: dict(wire.unpack_arrays(record)) for name, record in reply.items()}
    assert strategy.check_reply(ClientReply(0, strategy.node_of[0], 100, {}, arrays)) is None
    assert example_reply(strategy, 0, "evaluate", rng) == {}


# ================================================================= config: every mode refuses unknown values
@pytest.mark.parametrize("key,valid", [
    ("alpha-boundary", ("paper", "code")), ("sim-vector", ("delta_init", "params")),
    ("angles", ("standard", "greedy_columns")), ("regulariser", ("paper", "authors")),
    ("solver", ("closed_form", "cvxpy")), ("eval-model", ("aggregated", "local"))])
def test_every_mode_option_refuses_an_unknown_value_naming_the_valid_ones(key, valid):
    base = {"method": "fedsac", "dataset": "digits"}
    for value in valid:
        assert Config.from_run_config({**base, f"fedsac.{key}": value}).hparams()[key] == value
    with pytest.raises(ConfigError) as err:
        Config.from_run_config({**base, f"fedsac.{key}": "nonsense"})
    assert key in str(err.value) and all(v in str(err.value) for v in valid)


# ================================================================= the client, message by message
def client_env(state=None, server_round=2, config=None, **hp):
    cfg = Config.from_run_config({"method": "fedsac", "dataset": "digits", "model": "simplecnn", "local-steps": 3,
                                  "batch-size": 16, "lr": 0.05, "momentum": 0.5, "weight-decay": 1e-4,
                                  "client-threads": 1, "device": test_device(),
                                  **{f"fedsac.{k}": v for k, v in hp.items()}})
    return ClientEnv(cfg, 0, 3, RecordDict() if state is None else state, server_round,
                     {wire.SERVER_ROUND: server_round, wire.PHASE: "train", **(config or {})})


def received_model(env, shift=0.05):
    model = seeded_model("simplecnn", env.data.input_shape, env.data.num_classes, 1).to(env.device)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(shift)
    return model


def manual_fit(env, model, reg=None):
    """The client's local update written out: SGD(lr, momentum, wd) for local-steps batches of the
    client's shuffle stream on CE (+ the regulariser)."""
    opt = torch.optim.SGD(model.parameters(), lr=env.cfg["lr"], momentum=env.cfg["momentum"],
                          weight_decay=env.cfg["weight-decay"])
    loss_fn = lambda m, xb, yb: F.cross_entropy(m(xb), yb) + (0 if reg is None else reg(m))  # noqa: E731
    loss = train_loop(model, env.data.x_train, env.data.y_train, batch_size=16, steps=3, optimizer=opt,
                      generator=env.generator(0), loss_fn=loss_fn)
    return model, loss


@pytest.mark.parametrize("mode", ["off", "paper", "authors"])
def test_client_fit_equals_a_manual_local_update_and_uploads_theta_and_basis(mode):
    env = client_env(config={REGULARISER: mode}, **{"lambda": 3.0})
    start = received_model(env)
    received = parameters_to_vector(start.parameters()).detach().clone()
    content = RecordDict({wire.WEIGHTS: wire.pack_arrays(start.state_dict())})
    ref = None
    if mode == "authors":
        ref = {name: torch.randn_like(p) for name, p in start.named_parameters()}
        # sent in float64: the client casts c_i to its model's dtype and device
        content[REFERENCE] = wire.pack_arrays({k: wire.to_host(v.double()) for k, v in ref.items()})
    records, metrics = FedSaCClient(env).fit(content)

    expected = received_model(env)
    if mode == "paper":
        reg = lambda m: -3.0 * F.cosine_similarity(parameters_to_vector(m.parameters()), received, dim=0)  # noqa: E731
    elif mode == "authors":
        c = torch.cat([ref[name].reshape(-1) for name, _ in expected.named_parameters()])
        reg = lambda m: 3.0 * (c @ parameters_to_vector(m.parameters())) / parameters_to_vector(m.parameters()).norm()  # noqa: E731
    else:
        reg = None
    expected, loss = manual_fit(env, expected, reg)
    assert set(records) == {wire.WEIGHTS, SUBSPACE}
    uploaded = wire.unpack_arrays(records[wire.WEIGHTS])
    for k, v in expected.state_dict().items():
        np.testing.assert_allclose(uploaded[k], wire.to_host(v), rtol=1e-5, atol=1e-6)
    basis = wire.unpack_arrays(records[SUBSPACE])[BASIS]
    np.testing.assert_allclose(basis, subspace_basis(extract_features(expected, env.data.x_train), 3), atol=1e-4)
    assert metrics[wire.TRAIN_LOSS] == pytest.approx(loss, rel=1e-5)
    drift = float(F.cosine_similarity(parameters_to_vector(expected.parameters()).detach(), received, dim=0))
    assert metrics[wire.METHOD_METRIC_PREFIX + COS_TO_RECEIVED] == pytest.approx(drift, abs=1e-6)
    assert drift < 1.0
    kept = FedSaCClient(env).load_model(MODEL)  # theta_i is kept for evaluation
    for k, v in kept.state_dict().items():
        np.testing.assert_allclose(wire.to_host(v), uploaded[k], rtol=0, atol=0)


def test_client_regulariser_mode_changes_the_update_and_lambda_scales_it():
    """The same message with the regulariser off, and on with lambda 3: different models (the pull is
    really applied), and lambda 0 with the paper mode equals off."""
    outs = {}
    for name, mode, lam in (("off", "off", 3.0), ("on", "paper", 3.0), ("zero", "paper", 0.0)):
        env = client_env(config={REGULARISER: mode}, **{"lambda": lam})
        content = RecordDict({wire.WEIGHTS: wire.pack_arrays(received_model(env).state_dict())})
        outs[name] = wire.unpack_arrays(FedSaCClient(env).fit(content)[0][wire.WEIGHTS])
    assert any(not np.allclose(outs["off"][k], outs["on"][k]) for k in outs["off"])
    assert all(np.allclose(outs["off"][k], outs["zero"][k], atol=1e-7) for k in outs["off"])


def test_client_subspace_uses_k_and_the_centring_flag():
    env = client_env(config={REGULARISER: "off"}, k=5, center=True)
    start = received_model(env)
    records, _ = FedSaCClient(env).fit(RecordDict({wire.WEIGHTS: wire.pack_arrays(start.state_dict())}))
    expected, _ = manual_fit(env, received_model(env))
    basis = wire.unpack_arrays(records[SUBSPACE])[BASIS]
    assert basis.shape == (84, 5)
    np.testing.assert_allclose(basis, subspace_basis(extract_features(expected, env.data.x_train), 5, True), atol=1e-4)


@pytest.mark.parametrize("eval_model", ["local", "aggregated"])
def test_client_evaluates_its_own_trained_model_and_the_received_one(eval_model):
    state = RecordDict()
    env = client_env(state=state, **{"eval-model": eval_model})
    local = received_model(env, shift=0.0)
    aggregated = received_model(env, shift=0.0)
    x, y = env.data.x_test, env.data.y_test
    classes = torch.unique(y)
    with torch.no_grad():  # each model predicts one class present in the test split: both score above 0
        local.head.bias[classes[0]] += 100.0
        aggregated.head.bias[classes[1]] += 100.0
    env.save_module(MODEL, local)
    result = FedSaCClient(env).evaluate(RecordDict({wire.WEIGHTS: wire.pack_arrays(aggregated.state_dict())}))
    scores = {"local": evaluate_model(local, x, y), "aggregated": evaluate_model(aggregated, x, y)}
    assert scores["local"][1] == int((y == classes[0]).sum()) and scores["aggregated"][1] == int((y == classes[1]).sum())
    assert scores["local"] != scores["aggregated"]
    assert (result.loss, result.correct, result.num_examples) == pytest.approx(scores[eval_model])
    assert result.metrics == pytest.approx({LOCAL_ACC: scores["local"][1] / len(y),
                                            AGGREGATED_ACC: scores["aggregated"][1] / len(y)})
    # one test sample: the accuracies are 0 or 1 (n itself divides, not a floor of 2)
    env.data = dataclasses.replace(env.data, x_test=x[:1], y_test=y[:1])
    one = FedSaCClient(env).evaluate(RecordDict({wire.WEIGHTS: wire.pack_arrays(aggregated.state_dict())}))
    assert one.metrics == {LOCAL_ACC: float(y[0] == classes[0]), AGGREGATED_ACC: float(y[0] == classes[1])}


def test_client_evaluate_before_training_scores_the_seeded_initial_model():
    env = client_env(server_round=0, state=RecordDict({"meta": ConfigRecord({wire.STATE_ROUND: 0})}))
    initial = seeded_model("simplecnn", env.data.input_shape, env.data.num_classes, env.cfg["seed"])
    result = FedSaCClient(env).evaluate(RecordDict({wire.WEIGHTS: wire.pack_arrays(initial.state_dict())}))
    assert result.metrics[LOCAL_ACC] == result.metrics[AGGREGATED_ACC]
    assert result.num_examples == len(env.data.y_test)


# ================================================================= spec 14: the paper's partitions at CIFAR's size
def _cifar_like(num_classes: int, per_class: int, seed: int = 0):
    """A pool with CIFAR's train-set labels (``per_class`` of each class, shuffled); the features do
    not matter to a partitioner."""
    from partitions import Dataset

    y = np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class)).astype(np.int64)
    return Dataset(f"cifar{num_classes}-labels", np.zeros((len(y), 1), np.float32), y, num_classes)


def _pools(data, partition, params):
    from partitions import build_splits

    splits = build_splits(data, partition, 10, 0, {"val-fraction": 0.1, **params})  # the presets' split
    pools = [np.concatenate([s.train, s.val, s.test]) for s in splits]
    everything = np.concatenate(pools)
    assert len(everything) == len(np.unique(everything)) == len(data.y)  # disjoint, and together the pool
    return pools


@pytest.mark.parametrize("num_classes,per_client", [(10, 2), (100, 20)])
def test_pathological_cifar_partition_gives_each_client_its_classes_and_5000_samples(num_classes, per_client):
    """Spec 12.14 (the presets' pathological split, N = 10): CIFAR-10 -> 2 classes and 5,000 samples per
    client (CIFAR-100: 20 classes, 5,000); 5 groups of classes, each held by 2 clients with 2,500
    (250) of each of its classes."""
    data = _cifar_like(num_classes, 50_000 // num_classes)
    pools = _pools(data, "pathological", {"classes-per-client": per_client, "balance": True})
    assert [len(p) for p in pools] == [5_000] * 10
    classes = [frozenset(np.unique(data.y[p]).tolist()) for p in pools]
    assert all(len(c) == per_client for c in classes)
    assert len(set(classes)) == 5 and all(classes.count(c) == 2 for c in classes)
    half = 50_000 // num_classes // 2
    for p, c in zip(pools, classes):
        assert sorted(np.bincount(data.y[p], minlength=num_classes)[sorted(c)]) == [half] * per_client


def test_dirichlet_and_homo_cifar_partitions_follow_the_spec():
    """Spec 12.14: Dir(0.5) and Dir(0.1) with min-size 10 leave every client >= 10 samples; Homo sizes
    differ by <= 1 (an odd pool size, 50,003, so that they cannot all be equal)."""
    data = _cifar_like(10, 5_000)
    for alpha in (0.5, 0.1):
        pools = _pools(data, "dirichlet", {"alpha": alpha, "min-size": 10})
        sizes = [len(p) for p in pools]
        assert min(sizes) >= 10 and max(sizes) > 5_000  # not an even split
    odd = dataclasses.replace(data, x=np.zeros((50_003, 1), np.float32), y=np.concatenate([data.y, [0, 1, 2]]))
    sizes = sorted(len(p) for p in _pools(odd, "iid", {}))
    assert sizes[-1] - sizes[0] == 1 and sizes.count(5_001) == 3
