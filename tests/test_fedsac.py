"""FedSaC: the spec's section-12 invariants (each test is named after one), the server rule on real
replies, the client's loss and subspace (end-to-end runs: tests/test_fedsac_federation.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.linalg
import torch

from tests.fakes import fake_clients
from clients.fedsac import regulariser, subspace_basis
from fedcore import wire
from fedcore.config import Config
from fedcore.methods.fedsac import BASIS, REGULARISER, SUBSPACE
from fedcore.models import model_facts, seeded_model
from fedstrategies.aggregate import weighted_average
from fedstrategies.base import ClientReply
from fedstrategies.fedsac import FedSaCStrategy
from fedstrategies.fedsac_math import (aggregate_by_graph, alpha_at, collaboration_graph, complementarity_matrix,
                                       greedy_column_angles, principal_angles, project_rows_to_simplex,
                                       qp_objective, similarity_matrix, solve_graph_cvxpy)

SPEC_P = np.array([0.5, 0.3, 0.2])
SPEC_S = np.array([[1, .8, .2], [.8, 1, .5], [.2, .5, 1]])
SPEC_C = np.array([[1, .6, .3], [.6, 1, .9], [.3, .9, 1]])
SPEC_W = np.array([[0.5683, 0.4083, 0.0233], [0.6200, 0.3800, 0.0], [0.4383, 0.1783, 0.3833]])


def random_instance(rng, n):
    """Data weights, a symmetric similarity in [-1, 1] and a complementarity in [0, 1] with unit diagonals."""
    p = rng.random(n) + 0.05
    s = rng.uniform(-1, 1, (n, n))
    c = rng.random((n, n))
    s, c = (s + s.T) / 2, (c + c.T) / 2
    np.fill_diagonal(s, 1.0)
    np.fill_diagonal(c, 1.0)
    return p / p.sum(), s, c


def random_bases(rng, n, d=6, k=2):
    return np.stack([np.linalg.qr(rng.standard_normal((d, k)))[0] for _ in range(n)])


# ---------------------------------------------------------------- 1-2, 5: the QP
def test_every_graph_row_is_nonnegative_and_sums_to_one():
    rng = np.random.default_rng(0)
    for n, alpha, beta in itertools.product((1, 2, 5, 30), (0.0, 0.5, 0.9, 5.0), (0.0, 1.4, 10.0)):
        p, s, c = random_instance(rng, n)
        w = collaboration_graph(p, s, c, alpha, beta)
        assert w.shape == (n, n)
        assert (w >= -1e-8).all() and np.allclose(w.sum(axis=1), 1.0, atol=1e-6)


def test_spec_test_vector_n3():
    for solver in ("closed_form", "cvxpy"):
        w = collaboration_graph(SPEC_P, SPEC_S, SPEC_C, 0.9, 1.4, solver)
        np.testing.assert_allclose(w, SPEC_W, atol=1e-4)


def test_cvxpy_equals_closed_form_on_random_instances():
    rng = np.random.default_rng(1)
    for n in (2, 3, 7, 20, 60):
        p, s, c = random_instance(rng, n)
        alpha, beta = rng.uniform(0, 2, size=2)
        closed = collaboration_graph(p, s, c, alpha, beta)
        np.testing.assert_allclose(solve_graph_cvxpy(p, s, c, alpha, beta), closed, atol=1e-5)


def test_closed_form_equals_a_brute_force_grid_minimum():
    """On a 0.004 grid of the 3-simplex no point beats the closed form, and the best grid point is
    next to it."""
    step = 0.004
    a, b = np.meshgrid(np.arange(0, 1 + step / 2, step), np.arange(0, 1 + step / 2, step))
    grid = np.stack([a.ravel(), b.ravel(), 1 - a.ravel() - b.ravel()], axis=1)
    grid = grid[grid[:, 2] >= -1e-12].clip(0)
    rng = np.random.default_rng(2)
    for p, s, c in [(SPEC_P, SPEC_S, SPEC_C)] + [random_instance(rng, 3) for _ in range(5)]:
        w = collaboration_graph(p, s, c, 0.9, 1.4)
        for i in range(3):
            values = qp_objective(grid, p, np.tile(s[i], (len(grid), 1)), np.tile(c[i], (len(grid), 1)), 0.9, 1.4)
            exact = qp_objective(w[i:i + 1], p, s[i:i + 1], c[i:i + 1], 0.9, 1.4)[0]
            assert exact <= values.min() + 1e-12
            assert np.abs(grid[values.argmin()] - w[i]).max() <= 2 * step


def test_simplex_projection_is_the_nearest_point_of_the_simplex():
    """Against a generic solver of min |w - v|^2 on the simplex (scipy SLSQP), rows in all regimes."""
    from scipy.optimize import minimize

    rng = np.random.default_rng(3)
    points = np.concatenate([rng.normal(0, 1, (5, 6)), rng.normal(0, 0.01, (3, 6)) + 1 / 6, 10 * rng.normal(0, 1, (3, 6))])
    projected = project_rows_to_simplex(points)
    for v, w in zip(points, projected):
        res = minimize(lambda x: ((x - v) ** 2).sum(), np.full(6, 1 / 6), method="SLSQP", bounds=[(0, None)] * 6,
                       constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1}], options={"ftol": 1e-14})
        np.testing.assert_allclose(w, res.x, atol=1e-6)


def test_monotonicity_in_similarity_and_complementarity():
    """Raising S_ij never lowers W_ij; raising C_ij never raises it (alpha > 0)."""
    rng = np.random.default_rng(4)
    for _ in range(200):
        n = int(rng.integers(2, 8))
        p, s, c = random_instance(rng, n)
        i, j = rng.integers(0, n, size=2)
        w = collaboration_graph(p, s, c, 0.9, 1.4)
        s2, c2 = s.copy(), c.copy()
        s2[i, j] += rng.uniform(0, 0.5)
        c2[i, j] += rng.uniform(0, 0.5)
        assert collaboration_graph(p, s2, c, 0.9, 1.4)[i, j] >= w[i, j] - 1e-12
        assert collaboration_graph(p, s, c2, 0.9, 1.4)[i, j] <= w[i, j] + 1e-12


def test_alpha_beta_zero_gives_fedavg_weights():
    rng = np.random.default_rng(5)
    p, s, c = random_instance(rng, 6)
    np.testing.assert_allclose(collaboration_graph(p, s, c, 0.0, 0.0), np.tile(p, (6, 1)), atol=1e-12)


def test_alpha_zero_reduces_to_similarity_only_collaboration():
    """alpha = 0: the complementarity no longer matters, and the graph is the similarity-only QP
    (pFedGraph's rule): Proj_simplex(p + beta S_i / 2)."""
    rng = np.random.default_rng(6)
    p, s, c = random_instance(rng, 6)
    w = collaboration_graph(p, s, c, 0.0, 1.4)
    np.testing.assert_allclose(w, collaboration_graph(p, s, rng.random((6, 6)), 0.0, 1.4))
    np.testing.assert_allclose(w, project_rows_to_simplex(p[None, :] + 0.7 * s))
    assert not np.allclose(w, collaboration_graph(p, s, c, 0.9, 1.4))


# ---------------------------------------------------------------- 6-7: S and C
def test_s_and_c_symmetric_with_unit_diagonal_and_in_range():
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((9, 40))
    vectors[3] = 0.0  # a client whose update is zero
    s = similarity_matrix(vectors @ vectors.T)
    assert np.allclose(s, s.T) and np.allclose(np.diag(s), 1.0) and (np.abs(s) <= 1).all()
    assert (s[3, np.arange(9) != 3] == 0).all()
    np.testing.assert_allclose(s[0, 1], vectors[0] @ vectors[1] / np.linalg.norm(vectors[0]) / np.linalg.norm(vectors[1]))
    clamped = similarity_matrix(np.array([[1.0, 0.95], [0.95, 1.0]]), clamp=0.9)
    assert clamped[0, 1] == 1.0
    c = complementarity_matrix(random_bases(rng, 9, d=8, k=3))
    assert np.allclose(c, c.T) and np.allclose(np.diag(c), 1.0) and (c >= 0).all() and (c <= 1).all()


def test_principal_angles_identical_zero_orthogonal_half_pi_rotation_and_sign_invariant():
    rng = np.random.default_rng(8)
    d, k = 7, 3
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    u, orthogonal = q[:, :k], q[:, k:2 * k]
    rotation, _ = np.linalg.qr(rng.standard_normal((k, k)))
    bases = np.stack([u, orthogonal, u @ rotation, -u])
    angles = principal_angles(bases)
    np.testing.assert_allclose(angles[0, 0], 0.0, atol=1e-6)
    np.testing.assert_allclose(angles[0, 1], np.pi / 2, atol=1e-7)
    c = complementarity_matrix(bases)
    np.testing.assert_allclose(c[0], [1.0, 0.0, 1.0, 1.0], atol=1e-6)


def test_principal_angles_hand_computed_r3_case_and_scipy():
    """span{e1} vs span{(cos phi, sin phi, 0)}: one angle phi, C = cos phi; random pairs agree with
    scipy.linalg.subspace_angles."""
    for phi in (0.0, 0.3, 1.0, np.pi / 2):
        bases = np.array([[[1.0], [0.0], [0.0]], [[np.cos(phi)], [np.sin(phi)], [0.0]]])
        np.testing.assert_allclose(principal_angles(bases)[0, 1], [phi], atol=1e-7)
        np.testing.assert_allclose(complementarity_matrix(bases)[0, 1], np.cos(phi), atol=1e-7)
    bases = random_bases(np.random.default_rng(9), 5, d=10, k=3)
    angles = principal_angles(bases)
    for i, j in itertools.combinations(range(5), 2):
        np.testing.assert_allclose(np.sort(angles[i, j]), np.sort(scipy.linalg.subspace_angles(bases[i], bases[j])),
                                   atol=1e-7)


def test_greedy_column_angles_follow_the_authors_code_and_depend_on_signs():
    """The authors' variant: greedy matching of signed column cosines (here checked by brute force
    on a loop as their code does); flipping a column's sign changes it, unlike principal angles."""
    rng = np.random.default_rng(10)
    bases = random_bases(rng, 4, d=6, k=3)
    angles = greedy_column_angles(bases)
    for i, j in itertools.product(range(4), repeat=2):
        cos = bases[i].T @ bases[j]
        picked = []
        for _ in range(3):
            a, b = np.unravel_index(np.argmax(cos), cos.shape)
            picked.append(cos[a, b])
            cos[a, :], cos[:, b] = -np.inf, -np.inf
        np.testing.assert_allclose(angles[i, j], np.arccos(np.clip(picked, -1, 1)), atol=1e-7)
    flipped = np.stack([bases[0], -bases[0]])
    assert complementarity_matrix(flipped, "greedy_columns")[0, 1] < 0  # pi apart column by column
    np.testing.assert_allclose(complementarity_matrix(flipped)[0, 1], 1.0, atol=1e-7)


# ---------------------------------------------------------------- 8: the client's subspace
def test_subspace_basis_is_orthonormal_d_by_k_and_spans_the_top_singular_directions():
    rng = np.random.default_rng(11)
    features = torch.tensor(rng.standard_normal((50, 12)) * np.linspace(3, 0.1, 12) + 0.5)
    for center in (False, True):
        u = subspace_basis(features, 3, center)
        assert u.shape == (12, 3) and u.dtype == np.float32
        np.testing.assert_allclose(u.T @ u, np.eye(3), atol=1e-5)
        x = features.numpy() - (features.numpy().mean(0) if center else 0)
        top = np.linalg.svd(x)[2][:3].T
        np.testing.assert_allclose(u @ u.T, top @ top.T, atol=1e-5)  # same subspace (projectors)
        assert (u[np.abs(u).argmax(0), np.arange(3)] > 0).all()  # svd_flip signs
    assert subspace_basis(features[:2], 3).shape == (12, 3)  # fewer samples than k: still d x k
    np.testing.assert_allclose(subspace_basis(features[:2], 3).T @ subspace_basis(features[:2], 3), np.eye(3), atol=1e-5)


# ---------------------------------------------------------------- 9: aggregation
def test_aggregation_equals_manual_weighted_sum_and_identity_when_all_equal():
    rng = np.random.default_rng(12)
    w = collaboration_graph(*random_instance(rng, 4), 0.9, 1.4)
    tensor = rng.standard_normal((4, 3, 5)).astype(np.float32)
    mixed = aggregate_by_graph(w, tensor)
    assert mixed.shape == tensor.shape and mixed.dtype == np.float32
    manual = np.stack([sum(w[i, j] * tensor[j] for j in range(4)) for i in range(4)])
    np.testing.assert_allclose(mixed, manual, rtol=1e-5, atol=1e-6)
    same = np.repeat(tensor[:1], 4, axis=0)
    np.testing.assert_allclose(aggregate_by_graph(w, same), same, rtol=1e-6)
    w2 = collaboration_graph(*random_instance(rng, 4), 0.5, 1.6)
    np.testing.assert_allclose(aggregate_by_graph(0.3 * w + 0.7 * w2, tensor),
                               0.3 * mixed + 0.7 * aggregate_by_graph(w2, tensor), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- 10: the alpha schedule
def test_alpha_switched_off_for_the_last_30_percent_of_rounds():
    """T = 50: t = 0..34 (Flower rounds 1..35) on, 35..49 off; the authors' boundary keeps t = 35."""
    on = [r for r in range(1, 51) if alpha_at(r, 50, 0.9) == 0.9]
    assert on == list(range(1, 36)) and all(alpha_at(r, 50, 0.9) == 0.0 for r in range(36, 51))
    code = [r for r in range(1, 51) if alpha_at(r, 50, 0.9, boundary="code") == 0.9]
    assert code == list(range(1, 37))
    assert [alpha_at(r, 10, 0.9) for r in range(1, 11)] == [0.9] * 7 + [0.0] * 3


# ---------------------------------------------------------------- 11: the client regulariser
def test_client_regulariser_is_minus_lambda_at_the_received_model_and_no_gradient_reaches_it(device):
    model = seeded_model("simplecnn", (1, 8, 8), 10, 0).to(device)
    received = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone().requires_grad_(True)
    reg = regulariser("paper", 0.01, received)
    value = reg(model)
    assert value.item() == pytest.approx(-0.01, abs=1e-7)
    value.backward()
    assert received.grad is None  # the reference is detached
    assert all(p.grad is not None for p in model.parameters())


def test_client_regulariser_steps_increase_the_cosine_to_the_received_model(device):
    """With the cross-entropy switched off, SGD on -lambda cos(theta, theta~) pulls theta towards theta~."""
    model = seeded_model("simplecnn", (1, 8, 8), 10, 0).to(device)
    received = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    reg = regulariser("paper", 1.0, received)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    before = -reg(model).item()
    for _ in range(5):
        opt.zero_grad()
        reg(model).backward()
        opt.step()
    assert -reg(model).item() > before + 1e-3


def test_authors_regulariser_has_their_sign(device):
    model = seeded_model("simplecnn", (1, 8, 8), 10, 0).to(device)
    theta = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    reference = torch.randn_like(theta)
    expected = 0.5 * float(reference @ theta / theta.norm())
    assert regulariser("authors", 0.5, reference)(model).item() == pytest.approx(expected, rel=1e-5)


# ---------------------------------------------------------------- the strategy on real replies
def make_strategy(n: int = 4, input_shape=(1, 8, 8), num_classes: int = 10, run: dict | None = None,
                  **hp) -> FedSaCStrategy:
    """The strategy for ``n`` clients; ``hp`` are fedsac.* keys, ``run`` other run-config keys."""
    config = {"method": "fedsac", "dataset": "digits", "model": "simplecnn", "num-server-rounds": 10, **(run or {}),
              **{f"fedsac.{k}": v for k, v in hp.items()}}
    return FedSaCStrategy(Config.from_run_config(config), fake_clients(n, num_classes),
                          model_facts("simplecnn", input_shape, num_classes, 0))


def make_reply(strategy, pid: int, weights: dict, basis: np.ndarray, n: int = 100) -> ClientReply:
    return ClientReply(pid, strategy.node_of[pid], n, {}, {
        wire.WEIGHTS: {k: np.asarray(v, dtype=strategy.initial_weights[k].dtype) for k, v in weights.items()},
        SUBSPACE: {BASIS: np.asarray(basis, dtype=np.float32)}})


def noisy_weights(strategy, rng, scale=0.05):
    return {k: v + scale * rng.standard_normal(v.shape) for k, v in strategy.initial_weights.items()}


def test_payload_sizes_simplecnn_cifar10_and_cifar100():
    """Up: P parameters (62,006 / 69,656), a d x k = 84 x 3 basis and n_i; down: P parameters."""
    for classes, expected in ((10, 62_006), (100, 69_656)):
        strategy = make_strategy(2, (3, 32, 32), classes)
        schema = strategy.reply_schema(0)
        shapes = {k: getattr(s, "shape", s) for k, s in schema[wire.WEIGHTS].items()}  # ArraySpec or tuple
        assert sum(int(np.prod(s)) for s in shapes.values()) == expected
        assert {k: getattr(s, "shape", s) for k, s in schema[SUBSPACE].items()} == {BASIS: (84, 3)}
        down = strategy.train_payload(0, 1)
        assert set(down) == {wire.WEIGHTS}
        assert sum(v.size for v in wire.unpack_arrays(down[wire.WEIGHTS]).values()) == expected


def test_identical_clients_get_equal_weights_and_relabelling_permutes_the_graph():
    rng = np.random.default_rng(13)
    base = make_strategy(4)
    weights = [noisy_weights(base, rng) for _ in range(3)]
    bases = [np.linalg.qr(rng.standard_normal((84, 3)))[0] for _ in range(3)]
    sizes = [80, 120, 100]
    content = [0, 1, 2, 2]  # clients 2 and 3 hold identical (v, U, n)

    def graph(order):
        strategy = make_strategy(4)
        strategy.aggregate(1, [make_reply(strategy, pid, weights[content[order[pid]]], bases[content[order[pid]]],
                                          sizes[content[order[pid]]]) for pid in range(4)])
        return strategy.graph

    w = graph([0, 1, 2, 3])
    np.testing.assert_allclose(w[:, 2], w[:, 3], atol=1e-12)
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    perm = [2, 0, 3, 1]  # pid -> which original client's content it gets
    np.testing.assert_allclose(graph(perm), w[np.ix_(perm, perm)], atol=1e-12)


def test_alpha_beta_zero_makes_every_personal_model_the_fedavg_model():
    rng = np.random.default_rng(14)
    strategy = make_strategy(3, alpha=0.0, beta=0.0)
    replies = [make_reply(strategy, pid, noisy_weights(strategy, rng), np.linalg.qr(rng.standard_normal((84, 3)))[0],
                          n) for pid, n in enumerate((50, 150, 100))]
    strategy.aggregate(1, replies)
    fedavg = weighted_average((r.arrays[wire.WEIGHTS] for r in replies), [r.num_examples for r in replies])
    for pid in range(3):
        mixed = strategy.personal_weights(pid)
        assert list(mixed) == list(strategy.initial_weights)  # keys, order and shapes preserved
        for key, value in mixed.items():
            assert value.shape == strategy.initial_weights[key].shape
            np.testing.assert_allclose(value, fedavg[key], rtol=1e-5, atol=1e-6)


def test_strategy_aggregation_matches_a_manual_weighted_sum_per_tensor():
    rng = np.random.default_rng(15)
    strategy = make_strategy(3)
    replies = [make_reply(strategy, pid, noisy_weights(strategy, rng), np.linalg.qr(rng.standard_normal((84, 3)))[0])
               for pid in range(3)]
    metrics = strategy.aggregate(1, replies)
    w = strategy.graph
    assert metrics["alpha"] == 0.9 and np.allclose(w.sum(axis=1), 1.0)
    for i in range(3):
        for key, value in strategy.personal_weights(i).items():
            manual = sum(w[i, j] * replies[j].arrays[wire.WEIGHTS][key].astype(np.float64) for j in range(3))
            np.testing.assert_allclose(value, manual, rtol=1e-5, atol=1e-6)
    # the similarity is that of the updates from theta(0) by default
    deltas = [np.concatenate([(r.arrays[wire.WEIGHTS][k] - v).ravel() for k, v in strategy.initial_weights.items()])
              for r in replies]
    recorded = strategy.round_matrices["similarity"]
    np.testing.assert_allclose(recorded[0, 1], deltas[0] @ deltas[1] / np.linalg.norm(deltas[0]) / np.linalg.norm(deltas[1]),
                               rtol=1e-4)


def test_authors_regulariser_reference_is_the_graph_mix_of_normalised_models():
    """regulariser = "authors": client i also gets c_i = sum_j W_ij theta_j / |theta_j| (their code)."""
    rng = np.random.default_rng(19)
    strategy = make_strategy(3, regulariser="authors")
    replies = [make_reply(strategy, pid, noisy_weights(strategy, rng), np.linalg.qr(rng.standard_normal((84, 3)))[0])
               for pid in range(3)]
    strategy.aggregate(1, replies)
    thetas = [np.concatenate([r.arrays[wire.WEIGHTS][k].ravel() for k in strategy.initial_weights]) for r in replies]
    payload = strategy.train_payload(1, 2)
    reference = np.concatenate([v.ravel() for v in wire.unpack_arrays(payload["fedsac-reference"]).values()])
    manual = sum(strategy.graph[1, j] * thetas[j] / np.linalg.norm(thetas[j]) for j in range(3))
    np.testing.assert_allclose(reference, manual, rtol=1e-4, atol=1e-7)
    assert strategy.train_config(1, 2) == {REGULARISER: "authors"}


def test_partial_participation_changes_only_the_sampled_block():
    """Large-scale mode: 50 clients, fraction-train 0.2 -> |S_t| = 10 per round; only the S_t x S_t block
    of W and the S_t clients' personal models change."""
    rng = np.random.default_rng(16)
    strategy = make_strategy(50, run={"fraction-train": 0.2})
    first = strategy.sample_train(1)
    assert len(first) == 10
    strategy.aggregate(1, [make_reply(strategy, pid, noisy_weights(strategy, rng),
                                      np.linalg.qr(rng.standard_normal((84, 3)))[0]) for pid in first])
    before_graph = strategy.graph.copy()
    before_personal = {pid: {k: np.array(v) for k, v in strategy.personal_weights(pid).items()} for pid in range(50)}
    second = strategy.sample_train(2)
    assert len(second) == 10 and second != first
    strategy.aggregate(2, [make_reply(strategy, pid, noisy_weights(strategy, rng),
                                      np.linalg.qr(rng.standard_normal((84, 3)))[0]) for pid in second])
    block = np.zeros((50, 50), dtype=bool)
    block[np.ix_(second, second)] = True
    assert np.array_equal(strategy.graph[~block], before_graph[~block])
    assert not np.allclose(strategy.graph[block], before_graph[block])
    np.testing.assert_allclose(strategy.graph[np.ix_(second, second)].sum(axis=1), 1.0)
    for pid in range(50):
        now = strategy.personal_weights(pid)
        changed = any(not np.array_equal(now[k], before_personal[pid][k]) for k in now)
        assert changed == (pid in second), pid
    never = sorted(set(range(50)) - set(first) - set(second))[0]
    theta0 = strategy.personal_record(never)  # unseen clients get theta(0), one record packed once
    assert theta0 is strategy.personal_record(never) and all(
        np.array_equal(v, strategy.initial_weights[k]) for k, v in wire.unpack_arrays(theta0).items())
    assert strategy.train_config(never, 3) == {REGULARISER: "off"}
    assert strategy.train_config(second[0], 3) == {REGULARISER: "paper"}


def test_malformed_replies_are_checked():
    rng = np.random.default_rng(17)
    strategy = make_strategy(2)
    good = make_reply(strategy, 0, noisy_weights(strategy, rng), np.linalg.qr(rng.standard_normal((84, 3)))[0])
    assert strategy.check_reply(good) is None
    skewed = make_reply(strategy, 0, noisy_weights(strategy, rng), 2 * np.linalg.qr(rng.standard_normal((84, 3)))[0])
    assert "not orthonormal" in strategy.check_reply(skewed)
    empty = make_reply(strategy, 0, noisy_weights(strategy, rng), np.linalg.qr(rng.standard_normal((84, 3)))[0], n=0)
    assert "positive" in strategy.check_reply(empty)
    with pytest.raises(ValueError, match="exceeds the feature dimension"):
        make_strategy(2, k=100)


def test_checkpoint_round_trip_restores_personal_models_and_graph():
    rng = np.random.default_rng(18)
    strategy = make_strategy(3)
    strategy.aggregate(1, [make_reply(strategy, pid, noisy_weights(strategy, rng),
                                      np.linalg.qr(rng.standard_normal((84, 3)))[0]) for pid in range(3)])
    restored = make_strategy(3)
    restored.load_state_dict(strategy.state_dict())
    np.testing.assert_array_equal(restored.graph, strategy.graph)
    assert restored.num_examples == strategy.num_examples
    for pid in range(3):
        for key, value in strategy.personal_weights(pid).items():
            np.testing.assert_array_equal(restored.personal_weights(pid)[key], value)
    assert restored.train_config(0, 2) == {REGULARISER: "paper"}
