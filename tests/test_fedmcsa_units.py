"""FedMCSA, function by function: each number checked against a second route (an explicit loop, a hand
formula), the variants' option values, what each message carries, which model the client scores, and the
state kept across rounds. Fast and direct, so that mutation testing (tools/mutation.py) can run them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedcore import wire
from fedcore.config import Config, ConfigError
from fedcore.methods.fedmcsa import DEFAULT_VARIANT, HPARAMS, RECEIVE, UPLOAD, VARIANTS, resolve_options
from fedcore.models import model_facts
from fedstrategies.base import ClientInfo
from fedstrategies.fedmcsa import FedMCSAStrategy
from fedstrategies.fedmcsa_math import (attention, components, mcsa, mean_weights, size_weighted,
                                        stack_component)
from tests.conftest import test_device


def _loop_attention(x: np.ndarray, sigma: float) -> np.ndarray:
    """Eq. 7 with explicit loops: psi_ik = exp(sigma cos_ik) / sum_h exp(sigma cos_ih)."""
    s = len(x)
    cos = np.zeros((s, s))
    for i in range(s):
        for k in range(s):
            ni, nk = max(np.linalg.norm(x[i]), 1e-12), max(np.linalg.norm(x[k]), 1e-12)
            cos[i, k] = float(x[i] @ x[k]) / (ni * nk)
    psi = np.zeros((s, s))
    for i in range(s):
        row = [np.exp(sigma * (cos[i, k] - 1.0)) for k in range(s)]  # shifted by the max possible (1): same ratios
        psi[i] = np.array(row) / sum(row)
    return psi


# ------------------------------------------------------------------ fedmcsa_math
def test_attention_equals_an_explicit_loop_and_a_larger_sigma_sharpens_the_self_weight():
    x = np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [2.0, 0.1, 0.0]])
    for sigma in (0.5, 3.0, 20.0):
        np.testing.assert_allclose(attention(x, sigma), _loop_attention(x, sigma), rtol=1e-10, atol=1e-14)
    # hand value: two clients at 90 degrees, cos = 0: psi = [e^s, 1] / (e^s + 1)
    psi = attention(np.array([[1.0, 0.0], [0.0, 3.0]]), 2.0)
    np.testing.assert_allclose(psi[0], [np.e ** 2 / (np.e ** 2 + 1), 1 / (np.e ** 2 + 1)])
    # sigma is a sharpness, not a temperature: the self weight grows with it
    diag = [np.diag(attention(x, s)).mean() for s in (0.0, 1.0, 5.0, 25.0)]
    assert diag[0] == pytest.approx(0.25) and all(a < b for a, b in zip(diag, diag[1:]))
    # self-attention includes the client itself: cos(x_i, x_i) = 1 is its row's largest score
    assert (np.argmax(attention(x, 5.0), axis=1) == np.arange(4)).all()
    assert attention(x, 1.0).dtype == np.float64
    x32 = x.astype(np.float32)  # float32 models: the cosines and the softmax still run in float64
    assert attention(x32, 3.0).dtype == np.float64
    np.testing.assert_allclose(attention(x32, 3.0), _loop_attention(x32.astype(np.float64), 3.0), rtol=1e-6)


def test_attention_of_opposite_and_zero_vectors():
    x = np.array([[1.0, 2.0], [-1.0, -2.0], [0.0, 0.0]])
    psi = attention(x, 1.0)
    e = np.e
    np.testing.assert_allclose(psi[0], np.array([e, 1 / e, 1.0]) / (e + 1 / e + 1))  # cos = 1, -1, 0 (zero clamp)
    np.testing.assert_allclose(psi[2], [1 / 3] * 3)
    # a vector far larger than 1 does not change the cosine (norms, not squared norms)
    np.testing.assert_allclose(attention(x * 1e3, 1.0), psi, rtol=1e-9)
    # rounding can push a cosine past 1: it is clipped, so psi equals that of exact cosines
    big = np.array([[1e8, 1.0], [1e8, 1.0 + 1e-9]])
    np.testing.assert_allclose(attention(big, 50.0), 0.5, rtol=1e-12)


def test_attention_clamps_the_norms_at_the_given_eps():
    """A row shorter than eps is scored with norm eps: the cosines by hand with the clamped norms."""
    x = np.array([[3e-3, 4e-3], [1.0, 0.0], [0.0, 2.0]])
    norms = np.array([0.1, 1.0, 2.0])  # max(||x_i||, eps = 0.1): the first row's 5e-3 is clamped
    cos = np.clip((x @ x.T) / np.outer(norms, norms), -1.0, 1.0)
    expected = np.exp(5.0 * cos) / np.exp(5.0 * cos).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(attention(x, 5.0, eps=0.1), expected, rtol=1e-12)
    assert not np.allclose(attention(x, 5.0), expected, rtol=1e-6)  # the default eps leaves that row's norm alone


def test_attention_of_float32_models_is_computed_in_float64():
    """sigma = 50 magnifies a float32 Gram matrix's rounding of the cosines 50-fold in the exponent: float32 rows
    get the attention of their exact float64 values, and two equal clients get equal weights."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 4000)).astype(np.float32)
    x[3] = x[1]
    psi = attention(x, 50.0)
    np.testing.assert_allclose(psi, attention(x.astype(np.float64), 50.0), rtol=1e-12, atol=0)
    np.testing.assert_allclose(psi[1, [0, 2, 4]], psi[3, [0, 2, 4]], rtol=1e-12, atol=0)


def test_components_group_by_module_or_by_tensor_and_skip_counters():
    w = {"a.0.weight": np.zeros((2, 2), np.float32), "a.0.bias": np.zeros(2, np.float32),
         "scale": np.ones(1, np.float64), "a.0.steps": np.array(3, np.int64), "b.weight": np.zeros(3, np.float16)}
    assert components(w) == {"a.0": ["a.0.weight", "a.0.bias"], "scale": ["scale"], "b": ["b.weight"]}
    assert components(w, "layer") == components(w)
    assert components(w, "tensor") == {"a.0.weight": ["a.0.weight"], "a.0.bias": ["a.0.bias"], "scale": ["scale"],
                                       "b.weight": ["b.weight"]}
    with pytest.raises(ValueError, match="'layer' or 'tensor'"):
        components(w, "model")


def test_stack_component_concatenates_in_key_order_and_keeps_the_dtype():
    models = [{"w": np.arange(4, dtype=np.float32).reshape(2, 2) + 10 * i, "b": np.array([7.0, 8.0], np.float32) + i}
              for i in range(3)]
    x = stack_component(models, ["w", "b"])
    assert x.shape == (3, 6) and x.dtype == np.float32
    np.testing.assert_array_equal(x[1], [10, 11, 12, 13, 8, 9])
    np.testing.assert_array_equal(stack_component(models, ["b", "w"])[2], [9, 10, 20, 21, 22, 23])
    assert stack_component([{"v": np.ones(2, np.float64)}], ["v"]).dtype == np.float64


def test_a_component_of_three_tensors_is_stacked_and_split_back_in_order():
    """A BatchNorm layer is one component of four float tensors; three are enough to catch an offset error."""
    rng = np.random.default_rng(5)
    keys = ["bn.weight", "bn.bias", "bn.running_mean"]
    models = [{k: rng.standard_normal(n).astype(np.float32) for k, n in zip(keys, (2, 3, 4))} for _ in range(3)]
    x = stack_component(models, keys)
    np.testing.assert_array_equal(x[2], np.concatenate([models[2][k] for k in keys]))
    out, matrices = mcsa(models, 2.0)
    assert list(matrices) == ["bn"]
    for i, expected in enumerate(_loop_mix(models, keys, _loop_attention(x.astype(np.float64), 2.0))):
        np.testing.assert_allclose(np.concatenate([out[i][k] for k in keys]), expected, rtol=1e-4, atol=1e-5)


def test_size_weighting_and_the_mean_by_hand():
    psi = np.array([[0.5, 0.5], [0.2, 0.8]])
    np.testing.assert_allclose(size_weighted(psi, [1, 3]), [[0.25, 0.75], [0.2 / 2.6, 2.4 / 2.6]])
    np.testing.assert_allclose(mean_weights([1, 3, 4]), [[0.125, 0.375, 0.5]] * 3)


def _two_layer_models():
    rng = np.random.default_rng(3)
    return [{"l.weight": rng.standard_normal((2, 3)).astype(np.float32), "l.bias": rng.standard_normal(2).astype(
        np.float32), "n": np.array(i, np.int64)} for i in range(4)]


def _loop_mix(models, keys, psi):
    flat = [np.concatenate([m[k].astype(np.float64).ravel() for k in keys]) for m in models]
    return [sum(psi[i, k] * flat[k] for k in range(len(models))) for i in range(len(models))]


@pytest.mark.parametrize("mode", ["layer", "tensor"])
@pytest.mark.parametrize("size_weighting", [False, True])
def test_mcsa_equals_loops_for_every_mode_and_size_weighting(mode, size_weighting):
    models, sizes, sigma = _two_layer_models(), [5.0, 50.0, 20.0, 1.0], 4.0
    out, matrices = mcsa(models, sigma, mode=mode, sizes=sizes, size_weighting=size_weighting)
    groups = {"layer": {"l": ["l.weight", "l.bias"]}, "tensor": {"l.weight": ["l.weight"], "l.bias": ["l.bias"]}}[mode]
    assert set(matrices) == set(groups)
    for name, keys in groups.items():
        x = np.stack([np.concatenate([m[k].astype(np.float64).ravel() for k in keys]) for m in models])
        psi = _loop_attention(x, sigma)
        if size_weighting:
            psi = np.array([[psi[i, k] * sizes[k] / sum(psi[i, h] * sizes[h] for h in range(4)) for k in range(4)]
                            for i in range(4)])
        np.testing.assert_allclose(matrices[name], psi, rtol=1e-5, atol=1e-9)
        for i, expected in enumerate(_loop_mix(models, keys, psi)):
            got = np.concatenate([out[i][k].ravel() for k in keys])
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    for i, w in enumerate(out):  # float32 in, float32 out; the counter is each client's own value
        assert w["l.weight"].dtype == np.float32 and w["l.weight"].shape == (2, 3) and int(w["n"]) == i
        assert list(w) == ["l.weight", "l.bias", "n"]


def test_mcsa_mean_aggregation_weighs_by_size_and_ignores_sigma_and_the_attention():
    models, sizes = _two_layer_models(), [1.0, 2.0, 3.0, 4.0]
    for sigma in (0.0, 50.0):
        out, matrices = mcsa(models, sigma, sizes=sizes, aggregation="mean", size_weighting=True)
        np.testing.assert_allclose(matrices["l"], [[0.1, 0.2, 0.3, 0.4]] * 4)
        expected = sum(s * m["l.bias"].astype(np.float64) for s, m in zip(sizes, models)) / 10.0
        for w in out:
            np.testing.assert_allclose(w["l.bias"], expected, rtol=1e-5)


def test_mcsa_refuses_bad_arguments_and_handles_no_models():
    models = _two_layer_models()
    assert mcsa([], 1.0) == ([], {})
    with pytest.raises(ValueError, match="aggregation"):
        mcsa(models, 1.0, aggregation="median")
    with pytest.raises(ValueError, match="size"):
        mcsa(models, 1.0, size_weighting=True)
    with pytest.raises(ValueError, match="size"):
        mcsa(models, 1.0, sizes=[1, 2], size_weighting=True)
    with pytest.raises(ValueError, match="size"):
        mcsa(models, 1.0, sizes=[1, 2, 3], aggregation="mean")
    out, _ = mcsa(models, 1.0, sizes=[1, 2])  # sizes unused by plain attention: no check
    assert len(out) == 4


def test_mcsa_output_never_aliases_the_input():
    models = _two_layer_models()
    out, _ = mcsa(models, 2.0)
    out[0]["n"][...] = 99
    out[0]["l.bias"][...] = 99.0
    assert int(models[0]["n"]) == 0 and not (models[0]["l.bias"] == 99.0).any()


@pytest.mark.parametrize("mode", ["layer", "tensor"])
def test_every_components_attention_is_s_by_s_row_stochastic_with_the_self_weight_largest(mode):
    """Spec 12, invariant 1, on what mcsa returns for the Synthetic DNN (S = 6): each component's Psi is
    S x S, >= 0, rows sum to 1, Psi[i, i] >= Psi[i, k]; a zero-norm component (a zero bias, tensor mode)
    is the exception and gets the uniform row 1/S; and Psi is not symmetric."""
    rng = np.random.default_rng(11)
    shapes = {"body.1.weight": (20, 60), "body.1.bias": (20,), "head.weight": (10, 20), "head.bias": (10,)}
    models = [{k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()} for _ in range(6)]
    models[4]["head.bias"] = np.zeros(10, np.float32)
    for sigma in (1.0, 50.0):
        _, matrices = mcsa(models, sigma, mode=mode)
        assert list(matrices) == (["body.1", "head"] if mode == "layer" else list(shapes))
        for name, psi in matrices.items():
            assert psi.shape == (6, 6) and (psi >= 0).all()
            np.testing.assert_allclose(psi.sum(axis=1), 1.0, atol=1e-6)
            if sigma == 1.0:  # (at sigma = 50 the random directions give Psi ~ I, symmetric to rounding)
                assert np.abs(psi - psi.T).max() > 1e-4
            for i in range(6):
                if mode == "tensor" and name == "head.bias" and i == 4:
                    np.testing.assert_allclose(psi[i], 1 / 6, rtol=1e-12)  # zero norm: cos = 0 with everyone
                else:
                    assert all(psi[i, i] >= psi[i, k] for k in range(6)) and psi[i, i] > 1 / 6


# ------------------------------------------------------------------ the variants
def _cfg(**run) -> Config:
    return Config.from_run_config({"method": "fedmcsa", "dataset": "synthetic", **run})


@pytest.mark.parametrize("variant", ["paper", "authors-code", "spec"])
def test_each_variant_resolves_to_its_documented_values(variant):
    documented = {
        "paper": {"lambda": 5.0, "train": "all", "component": "layer", "size-weighting": False, "weight-decay": 0.0},
        "authors-code": {"lambda": 0.0, "train": "all", "component": "tensor", "size-weighting": True,
                         "weight-decay": 0.001},
        "spec": {"lambda": 5.0, "train": "sampled", "component": "layer", "size-weighting": False,
                 "weight-decay": 0.0},
    }[variant]
    assert VARIANTS[variant] == documented
    options = resolve_options(_cfg(**{"fedmcsa.variant": variant}))
    assert {k: options[k] for k in documented} == documented
    assert options["sigma"] == 50.0 and options["aggregation"] == "attention" and options["clients-per-round"] == 20


def test_the_default_variant_and_the_defaults_of_the_other_options():
    assert DEFAULT_VARIANT == "authors-code" and HPARAMS["variant"].default == DEFAULT_VARIANT
    options = resolve_options(_cfg())
    assert options["variant"] == DEFAULT_VARIANT
    assert {k: options[k] for k in VARIANTS[DEFAULT_VARIANT]} == VARIANTS[DEFAULT_VARIANT]
    assert {k: HPARAMS[k].default for k in ("sigma", "clients-per-round", "aggregation", "attention-round")} == {
        "sigma": 50.0, "clients-per-round": 20, "aggregation": "attention", "attention-round": 0}
    assert all(HPARAMS[k].default == "auto" for k in ("lambda", "train", "component", "size-weighting"))


def test_the_paper_setting_weight_decay_is_the_chosen_variants_and_the_defaults_when_none_is_given():
    from fedcore.paper_settings import paper_setting

    assert VARIANTS[DEFAULT_VARIANT]["weight-decay"] != VARIANTS["paper"]["weight-decay"]
    assert paper_setting("fedmcsa", "synthetic", {})["weight-decay"] == VARIANTS[DEFAULT_VARIANT]["weight-decay"]
    for variant in VARIANTS:
        assert paper_setting("fedmcsa", "synthetic", {"variant": variant})["weight-decay"] == \
            VARIANTS[variant]["weight-decay"]


def test_an_option_set_alone_wins_over_the_variant():
    options = resolve_options(_cfg(**{"fedmcsa.variant": "authors-code", "fedmcsa.lambda": 2.5,
                                      "fedmcsa.component": "layer", "fedmcsa.size-weighting": False,
                                      "fedmcsa.train": "sampled", "weight-decay": 0.0}))
    assert (options["lambda"], options["component"], options["size-weighting"], options["train"],
            options["weight-decay"]) == (2.5, "layer", False, "sampled", 0.0)
    # a value equal to the variant's is kept as given, and another variant leaves it alone
    assert resolve_options(_cfg(**{"fedmcsa.variant": "paper", "fedmcsa.lambda": 0.0}))["lambda"] == 0.0
    assert resolve_options(_cfg(**{"fedmcsa.variant": "paper", "weight-decay": 0.01}))["weight-decay"] == 0.01
    assert resolve_options(_cfg(**{"fedmcsa.variant": "authors-code", "fedmcsa.size-weighting": True,
                                   "fedmcsa.lambda": 5.0}))["lambda"] == 5.0


@pytest.mark.parametrize("variant, decay", [("paper", 0.0), ("authors-code", 0.001), ("spec", 0.0)])
def test_the_resolved_run_config_holds_the_weight_decay_the_clients_train_with(variant, decay):
    """config.json (the resolved config) says what each client uses: the variant's weight decay where left at
    auto, named as fedmcsa's paper setting; a value given wins and is not "auto"."""
    cfg = _cfg(**{"fedmcsa.variant": variant})
    assert cfg["weight-decay"] == decay == resolve_options(cfg)["weight-decay"]
    assert cfg.auto_sources["weight-decay"] == "fedmcsa's paper setting"
    given = _cfg(**{"fedmcsa.variant": variant, "weight-decay": 0.005})
    assert given["weight-decay"] == 0.005 == resolve_options(given)["weight-decay"]
    assert "weight-decay" not in given.auto_sources


def test_bad_variant_and_option_values_are_config_errors_naming_the_key():
    with pytest.raises(ConfigError, match="fedmcsa.variant.*paper, authors-code, spec"):
        _cfg(**{"fedmcsa.variant": "code"})
    with pytest.raises(ConfigError, match="fedmcsa.lambda"):
        _cfg(**{"fedmcsa.lambda": "five"})
    with pytest.raises(ConfigError, match="fedmcsa.size-weighting"):
        _cfg(**{"fedmcsa.size-weighting": 1.0})
    with pytest.raises(ConfigError, match="fedmcsa.component"):
        _cfg(**{"fedmcsa.component": "model"})


# ------------------------------------------------------------------ the strategy, called directly
def _clients(sizes):
    counts = np.ones(10, np.int64)
    return {pid: ClientInfo(pid, 100 + pid, n, 10, counts, counts) for pid, n in enumerate(sizes)}


def _strategy(sizes=(10, 40, 20, 30, 80), rounds=4, model="mlr", **hp) -> FedMCSAStrategy:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    cfg = Config.from_run_config({"method": "fedmcsa", "dataset": "synthetic", "model": model,
                                  "num-server-rounds": rounds, **{f"fedmcsa.{k}": v for k, v in hp.items()}})
    return FedMCSAStrategy(cfg, _clients(sizes), model_facts(model, (60,), 10, 0))


def _random_models(strategy, seed=0):
    rng = np.random.default_rng(seed)
    return {pid: {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in strategy.initial_weights.items()}
            for pid in strategy.clients}


@pytest.mark.parametrize("variant", ["paper", "authors-code"])
def test_begin_round_sends_each_sampled_client_its_row_of_the_attention_with_the_variants_options(variant):
    strategy = _strategy(variant=variant, sigma=3.0, **{"clients-per-round": 3})
    strategy.models = _random_models(strategy)
    strategy.begin_round(2, list(strategy.clients))
    sampled = strategy.exchange_set(2)
    assert len(sampled) == 3 == strategy.num_sampled
    opts = VARIANTS[variant]
    expected, matrices = mcsa([strategy.models[p] for p in sampled], 3.0, mode=opts["component"],
                              sizes=[strategy.clients[p].num_train for p in sampled],
                              size_weighting=opts["size-weighting"])
    assert set(strategy._outgoing) == set(sampled)
    for pid, w in zip(sampled, expected):
        got = wire.unpack_arrays(strategy._outgoing[pid])
        assert all(np.array_equal(got[k], w[k]) for k in w)
    self_weight = np.mean([np.diag(p).mean() for p in matrices.values()])
    assert strategy._metrics["self-weight"] == pytest.approx(self_weight)


def test_size_weighting_uses_each_clients_training_size():
    strategy = _strategy(sizes=(1, 1000), variant="paper", sigma=0.0, **{"size-weighting": True})
    strategy.models = _random_models(strategy)
    strategy.begin_round(1, [0, 1])
    got = wire.unpack_arrays(strategy._outgoing[0])["head.bias"]
    expected = (strategy.models[0]["head.bias"] * 1 + strategy.models[1]["head.bias"] * 1000) / 1001
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_the_ablation_without_mcsa_sends_the_size_weighted_mean():
    strategy = _strategy(sizes=(1, 3), variant="paper", sigma=50.0, aggregation="mean")
    strategy.models = _random_models(strategy)
    strategy.begin_round(1, [0, 1])
    expected = (strategy.models[0]["head.weight"] * 1 + strategy.models[1]["head.weight"] * 3) / 4
    for pid in (0, 1):
        np.testing.assert_allclose(wire.unpack_arrays(strategy._outgoing[pid])["head.weight"], expected, atol=1e-6)
    assert strategy._metrics["self-weight"] == pytest.approx((0.25 + 0.75) / 2)


def test_the_server_uses_u0_for_a_client_that_never_uploaded():
    strategy = _strategy(variant="paper")
    strategy.models = {0: _random_models(strategy)[0]}
    assert strategy.model_of(0) is strategy.models[0] and strategy.model_of(3) is strategy.initial_weights


def test_who_trains_who_receives_and_who_uploads_in_each_mode():
    strategy = _strategy(sizes=(10,) * 6, rounds=3, variant="paper", **{"clients-per-round": 2})
    assert strategy.sample_train(1) == list(range(6))
    for rnd in (1, 2, 3):
        strategy.begin_round(rnd, list(range(6)))
        now, later = set(strategy.exchange_set(rnd)), set(strategy.exchange_set(rnd + 1))
        for pid in range(6):
            cfg = strategy.train_config(pid, rnd)
            assert cfg == {RECEIVE: pid in now, UPLOAD: pid in (later if rnd < 3 else set())}
            assert (wire.WEIGHTS in strategy.train_payload(pid, rnd)) is (pid in now)
            assert (wire.WEIGHTS in strategy.reply_schema(pid)) is cfg[UPLOAD]
    sampled = _strategy(sizes=(10,) * 6, rounds=3, variant="spec", **{"clients-per-round": 2})
    assert sampled.sample_train(2) == sampled.exchange_set(2) and len(sampled.sample_train(2)) == 2
    sampled.begin_round(3, sampled.sample_train(3))  # the last round too: every trained client uploads
    assert all(sampled.train_config(p, 3) == {RECEIVE: True, UPLOAD: True} for p in sampled.exchange_set(3))
    assert _strategy(sizes=(10,) * 3, **{"clients-per-round": 20}).num_sampled == 3  # S is at most N


def test_the_attention_matrices_of_the_chosen_round_are_recorded():
    for chosen, recorded in ((0, {3}), (2, {2})):
        strategy = _strategy(sizes=(10,) * 4, rounds=3, model="dnn", variant="paper",
                             **{"clients-per-round": 3, "attention-round": chosen})
        strategy.models = _random_models(strategy)
        seen = set()
        for rnd in (1, 2, 3):
            strategy.round_matrices = {}
            strategy.begin_round(rnd, list(range(4)))
            if strategy.round_matrices:
                seen.add(rnd)
                assert set(strategy.round_matrices) == {"sampled-pids", "attention/body.1", "attention/head"}
                np.testing.assert_array_equal(strategy.round_matrices["sampled-pids"], strategy.exchange_set(rnd))
                assert strategy.round_matrices["attention/head"].shape == (3, 3)
        assert seen == recorded


def test_aggregate_stores_a_copy_of_each_upload_and_counts_them():
    from fedstrategies.base import ClientReply

    strategy = _strategy(variant="paper")
    strategy._metrics = {"self-weight": 0.5}
    arrays = {k: np.full(v.shape, 2.0, v.dtype) for k, v in strategy.initial_weights.items()}
    replies = [ClientReply(pid=1, **_reply_fields(arrays)), ClientReply(pid=2, **_reply_fields(None)),
               ClientReply(pid=3, **_reply_fields({k: v + 1 for k, v in arrays.items()}))]
    metrics = strategy.aggregate(1, replies)
    assert metrics == {"self-weight": 0.5, "uploads": 2}
    assert set(strategy.models) == {1, 3} and (strategy.models[3]["head.bias"] == 3.0).all()
    arrays["head.bias"][...] = -1.0
    assert (strategy.models[1]["head.bias"] == 2.0).all()  # a copy, not the reply's buffer


def _reply_fields(arrays):
    return {"node_id": 7, "num_examples": 10, "metrics": {}, "arrays": {} if arrays is None else {wire.WEIGHTS: arrays}}


def test_check_reply_names_a_wrong_dtype():
    from fedstrategies.base import ClientReply

    strategy = _strategy(variant="paper")
    good = {k: v.copy() for k, v in strategy.initial_weights.items()}
    assert strategy.check_reply(ClientReply(pid=0, **_reply_fields(good))) is None
    assert strategy.check_reply(ClientReply(pid=0, **_reply_fields(None))) is None
    bad = {**good, "head.bias": good["head.bias"].astype(np.float64)}
    assert strategy.check_reply(ClientReply(pid=0, **_reply_fields(bad))) == (
        "weights/head.bias has dtype float64, expected float32")


# ------------------------------------------------------------------ the client
def _env(tmp_path, state, server_round, receive, upload, **run):
    from clients.base import ClientEnv

    cfg = Config.from_run_config({"method": "fedmcsa", "dataset": "digits", "partition": "pathological",
                                  "model": "mlr", "results-dir": str(tmp_path), "local-steps": 1,
                                  "batch-size": 10_000, "lr": 0.1, "device": test_device(), **run})
    return ClientEnv(cfg, 0, 3, state, server_round,
                     {wire.SERVER_ROUND: server_round, wire.PHASE: "train", RECEIVE: receive, UPLOAD: upload})


def _message(env, value):
    from clients.fedmcsa import FedMCSAClient

    model = FedMCSAClient(env).new_model()
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.linspace(-value, value, p.numel()).reshape(p.shape) * (i + 1))
    return RecordDict({wire.WEIGHTS: wire.pack_arrays(model.state_dict())}), model


def _one_step(model, centre, data, lr, lam, wd):
    """Theta - lr (grad f + lam (Theta - centre) + wd Theta), one full batch, by hand."""
    model.zero_grad()
    F.cross_entropy(model(data.x_train), data.y_train).backward()
    return {n: wire.to_host((p - lr * (p.grad + lam * (p - c) + wd * p)))
            for (n, p), c in zip(model.named_parameters(), centre.parameters())}


def test_proximal_objective_value_and_its_gradient_direction():
    from clients.fedmcsa import proximal_objective

    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        model.bias.copy_(torch.tensor([1.0, -1.0]))
    centre = [torch.zeros(2, 2), torch.tensor([1.0, 1.0])]
    data = lambda m, xb, yb: torch.tensor(0.25)  # noqa: E731  a constant data loss
    value = proximal_objective(3.0, centre, data_loss=data)(model, None, None)
    assert float(value) == pytest.approx(0.25 + 0.5 * 3.0 * (1 + 4 + 9 + 16 + 0 + 4))
    proximal_objective(3.0, centre)(model, torch.ones(1, 2), torch.tensor([0])).backward()
    ce = torch.nn.Linear(2, 2)
    ce.load_state_dict(model.state_dict())
    F.cross_entropy(ce(torch.ones(1, 2)), torch.tensor([0])).backward()
    # the proximal gradient is lambda (Theta - centre): it points away from the centre
    torch.testing.assert_close(model.weight.grad - ce.weight.grad, 3.0 * model.weight.detach())
    torch.testing.assert_close(model.bias.grad - ce.bias.grad, torch.tensor([0.0, -6.0]))


@pytest.mark.parametrize("variant,lam,wd", [("paper", 5.0, 0.0), ("authors-code", 0.0, 0.001), ("spec", 5.0, 0.0)])
def test_the_client_step_uses_the_variants_lambda_and_weight_decay(tmp_path, variant, lam, wd):
    """Round 1 receives W and trains from it; round 2 receives nothing and takes one full-batch step from its own
    model towards the old centre W, with the variant's lambda and weight decay."""
    from clients.fedmcsa import CENTRE, MODEL, FedMCSAClient

    state = RecordDict()
    env = _env(tmp_path, state, 1, True, False, **{"fedmcsa.variant": variant})
    content, w = _message(env, 0.3)
    records, metrics = FedMCSAClient(env).fit(content)
    assert records == {} and metrics[wire.TRAIN_LOSS] > 0
    client = FedMCSAClient(env)
    theta1 = client.load_model(MODEL)
    assert all(torch.equal(a, b) for a, b in zip(client.load_model(CENTRE).parameters(), w.parameters()))
    expected1 = _one_step(client.model_from(content, wire.WEIGHTS), w, client.data, 0.1, lam, wd)
    for name, p in theta1.named_parameters():
        np.testing.assert_allclose(wire.to_host(p), expected1[name], rtol=1e-5, atol=1e-6)

    env2 = _env(tmp_path, state, 2, False, True, **{"fedmcsa.variant": variant})
    records, _ = FedMCSAClient(env2).fit(RecordDict())
    expected2 = _one_step(theta1, w, client.data, 0.1, lam, wd)
    got = wire.unpack_arrays(records[wire.WEIGHTS])
    for name in expected2:
        np.testing.assert_allclose(got[name], expected2[name], rtol=1e-5, atol=1e-6)
    saved = FedMCSAClient(env2).load_model(MODEL)  # the uploaded model is the one kept for the next round
    assert all(np.array_equal(got[n], wire.to_host(p)) for n, p in saved.named_parameters())


def test_an_explicit_weight_decay_wins_over_the_variants(tmp_path):
    from clients.fedmcsa import MODEL, FedMCSAClient

    state = RecordDict()
    env = _env(tmp_path, state, 1, True, False, **{"fedmcsa.variant": "authors-code", "weight-decay": 0.5})
    content, w = _message(env, 0.3)
    FedMCSAClient(env).fit(content)
    client = FedMCSAClient(env)
    expected = _one_step(client.model_from(content, wire.WEIGHTS), w, client.data, 0.1, 0.0, 0.5)
    for name, p in client.load_model(MODEL).named_parameters():
        np.testing.assert_allclose(wire.to_host(p), expected[name], rtol=1e-5, atol=1e-6)


def test_a_new_model_replaces_both_the_trained_model_and_the_centre(tmp_path):
    from clients.fedmcsa import CENTRE, MODEL, FedMCSAClient

    state = RecordDict()
    run = {"fedmcsa.variant": "paper", "lr": 1e-9}
    env = _env(tmp_path, state, 1, True, False, **run)
    FedMCSAClient(env).fit(_message(env, 0.3)[0])
    env2 = _env(tmp_path, state, 2, True, False, **run)
    content2, w2 = _message(env2, 0.7)
    FedMCSAClient(env2).fit(content2)
    client = FedMCSAClient(env2)
    for saved in (client.load_model(CENTRE), client.load_model(MODEL)):
        for a, b in zip(saved.parameters(), w2.parameters()):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_epoch_budget_when_local_steps_is_zero(tmp_path):
    from clients.fedmcsa import FedMCSAClient

    class Counting(FedMCSAClient):
        def train(self, model, **kwargs):
            kwargs["after_step"] = lambda step, loss, idx: self.sizes.append(len(idx))
            return super().train(model, **kwargs)

    env = _env(tmp_path, RecordDict(), 1, False, False, **{"local-steps": 0, "local-epochs": 1, "batch-size": 32})
    client = Counting(env)
    client.sizes = []
    client.fit(RecordDict())
    n = client.data.num_train
    assert n % 32 != 0 and sum(client.sizes) == n and client.sizes[-1] == n % 32  # one epoch, a short last batch


def test_evaluation_scores_the_trained_model_not_the_received_one_or_the_centre(tmp_path):
    from clients.fedmcsa import CENTRE, MODEL, FedMCSAClient
    from clients.training import evaluate_model

    state = RecordDict()
    env = _env(tmp_path, state, 1, True, False, **{"fedmcsa.variant": "paper", "local-steps": 30, "lr": 0.01,
                                                   "batch-size": 20})
    content, _ = _message(env, 0.0)  # W = 0: chance accuracy
    FedMCSAClient(env).fit(content)
    client = FedMCSAClient(_env(tmp_path, state, 1, False, False))
    result = client.evaluate(RecordDict())
    trained = evaluate_model(client.load_model(MODEL), client.data.x_test, client.data.y_test)
    centre = evaluate_model(client.load_model(CENTRE), client.data.x_test, client.data.y_test)
    assert (result.loss, result.correct, result.num_examples) == tuple(trained) and trained[1] > centre[1]


def test_configure_train_messages_carry_the_personalised_model(tmp_path):
    strategy = _strategy(sizes=(10,) * 4, rounds=2, variant="paper", **{"clients-per-round": 2})
    strategy.models = _random_models(strategy)
    msgs = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), None))
    assert len(msgs) == 4
    for m in msgs:
        pid = strategy.pid_of[m.metadata.dst_node_id]
        if pid in strategy.exchange_set(1):
            got = wire.unpack_arrays(m.content.array_records[wire.WEIGHTS])
            sent = wire.unpack_arrays(strategy._outgoing[pid])
            assert all(np.array_equal(got[k], sent[k]) for k in sent)
        else:
            assert wire.WEIGHTS not in m.content.array_records


def test_lambda_zero_makes_the_client_step_plain_sgd(tmp_path):
    """Spec 12, invariant 9: with lambda = 0 (and no weight decay) a step from Theta != W_local is
    Theta - eta grad f(Theta), written out here by hand; with lambda = 5 the same step differs (the pull
    is real when Theta != W_local)."""
    from clients.fedmcsa import MODEL, FedMCSAClient

    got = {}
    for lam in (0.0, 5.0):
        state = RecordDict()
        run = {"fedmcsa.variant": "paper", "fedmcsa.lambda": lam, "weight-decay": 0.0}
        env = _env(tmp_path, state, 1, True, False, **run)
        content, w = _message(env, 0.3)
        FedMCSAClient(env).fit(content)  # round 1: Theta = W_local = W, then one step
        theta1 = FedMCSAClient(env).load_model(MODEL)
        assert any(not torch.equal(a, b) for a, b in zip(theta1.parameters(), w.parameters()))
        records, _ = FedMCSAClient(_env(tmp_path, state, 2, False, True, **run)).fit(RecordDict())
        got[lam] = wire.unpack_arrays(records[wire.WEIGHTS])
        if lam == 0.0:
            data = FedMCSAClient(env).data
            theta1.zero_grad()
            F.cross_entropy(theta1(data.x_train), data.y_train).backward()
            for name, p in theta1.named_parameters():
                np.testing.assert_allclose(got[lam][name], wire.to_host((p - 0.1 * p.grad)), rtol=1e-5, atol=1e-6)
    assert any(not np.allclose(got[0.0][k], got[5.0][k], atol=1e-4) for k in got[0.0])


def test_server_memory_holds_at_most_n_models_and_each_round_changes_exactly_s_entries():
    """Spec 12, invariant 10, through Flower messages with every client training (Alg. 1): the server keeps
    one model per client id (at most N = 10), and each round exactly the |S| = 4 models uploaded for the
    next round's attention change; after the last round nothing is uploaded."""
    from tests.test_fedmcsa import _round
    from tests.test_fedmcsa import _strategy as flower_strategy

    strategy = flower_strategy(10, **{"clients-per-round": 4, "variant": "paper"})
    for rnd in range(1, 6):
        before = {pid: {k: v.copy() for k, v in m.items()} for pid, m in strategy.models.items()}
        msgs, _ = _round(strategy, rnd)
        assert len(msgs) == 10  # every client trains
        changed = {pid for pid, m in strategy.models.items()
                   if pid not in before or any(not np.array_equal(m[k], before[pid][k]) for k in m)}
        assert changed == (set(strategy.exchange_set(rnd + 1)) if rnd < 5 else set())
        assert len(changed) == (4 if rnd < 5 else 0)
        assert set(strategy.models) <= set(range(10)) and strategy.dropped == []
