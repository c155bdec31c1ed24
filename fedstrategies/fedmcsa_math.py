"""FedMCSA's server rule on numpy arrays, its products on the server device: model-component
self-attention (Guo et al., Eqs. 6-8).

For every component l (a layer: its weight and bias together; or a single tensor) the sampled
clients' flattened parameters X_l (S x P_l) are query, key and value at once:

    A_l   = cos(X_l, X_l)                  (S x S, one matrix product of row-normalised X_l)
    Psi_l = softmax_row(sigma * A_l)       (Eq. 7, normalised over the keys k for each query i)
    W_l   = Psi_l X_l                      (Eq. 6: client i's new layer, a convex mix of all of them)

The printed Eq. 7 normalises by a sum indexed by k instead of i; that is a typo (rows would not sum
to 1, contradicting the paper's "convex combination"), so the softmax runs over each row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import softmax  # server code only: loaded with the strategy, not inside its first round

EPS = 1e-12  # norm clamp: a zero component has cosine 0 with every other one, itself included


def components(weights: dict[str, np.ndarray], mode: str = "layer") -> dict[str, list[str]]:
    """Group state-dict keys into the model components that attention runs over.

    ``layer`` (the paper: "each layer in a model as a basic unit") groups tensors by module, so
    ``body.1.weight`` and ``body.1.bias`` form one component ``body.1``; ``tensor`` (the authors'
    code) makes every tensor its own component. Conv kernels (4-D) are flattened like any other
    tensor. Non-float tensors (BatchNorm's step counter) are counters, not parameters: they belong
    to no component and every client keeps its own.
    """
    if mode not in ("layer", "tensor"):
        raise ValueError(f"component mode must be 'layer' or 'tensor', got {mode!r}")
    groups: dict[str, list[str]] = {}
    for key, value in weights.items():
        if np.asarray(value).dtype.kind != "f":
            continue
        name = key.rsplit(".", 1)[0] if mode == "layer" and "." in key else key
        groups.setdefault(name, []).append(key)
    return groups


def attention(x: np.ndarray, sigma: float, eps: float = EPS) -> np.ndarray:
    """Psi = softmax_row(sigma * cos(x_i, x_k)) for the rows of ``x`` (S x P); returns S x S float64.

    One float64 matrix product on the server device gives the Gram matrix (float64: sigma = 50 would
    magnify float32's rounding of the cosines 50-fold in the exponent, and clients with equal models
    would not get equal weights), whose diagonal holds the squared norms (clamped at ``eps``), so the
    cosines cost no second pass over x; they are clipped to [-1, 1] against rounding. scipy's softmax
    subtracts each row's maximum first, so sigma = 50 (exp(50)) cannot overflow.
    """
    from fedstrategies import pairwise  # imported on use (torch): every ClientApp imports this module

    return _attention_of_gram(pairwise.gram_rows(x, "float64"), sigma, eps)


def _attention_of_gram(gram: np.ndarray, sigma: float, eps: float = EPS) -> np.ndarray:
    """``attention`` from the rows' float64 Gram matrix."""
    norms = np.maximum(np.sqrt(np.maximum(np.diag(gram), 0.0)), eps)
    cos = np.clip(gram / np.outer(norms, norms), -1.0, 1.0)
    return softmax(sigma * cos, axis=1)


def size_weighted(psi: np.ndarray, sizes: Sequence[float]) -> np.ndarray:
    """The authors' code's variant: psi'_ik = psi_ik n_k / sum_h psi_ih n_h (rows still sum to 1)."""
    scaled = np.asarray(psi, dtype=np.float64) * np.asarray(sizes, dtype=np.float64)[None, :]
    return scaled / scaled.sum(axis=1, keepdims=True)


def mean_weights(sizes: Sequence[float]) -> np.ndarray:
    """FedMCSA without MCSA (ablation, spec section 9): every row is the n_k-weighted mean."""
    n = np.asarray(sizes, dtype=np.float64)
    return np.tile(n / n.sum(), (len(n), 1))


def stack_component(models: Sequence[dict[str, np.ndarray]], keys: list[str]) -> np.ndarray:
    """S x P_l: each model's tensors of one component, flattened and concatenated in key order
    (written straight into one preallocated matrix: one copy of the replies, no temporaries)."""
    first = models[0]
    x = np.empty((len(models), sum(first[k].size for k in keys)), dtype=np.result_type(*(first[k] for k in keys)))
    for i, model in enumerate(models):
        start = 0
        for k in keys:
            size = first[k].size
            x[i, start:start + size] = np.asarray(model[k]).reshape(-1)
            start += size
    return x


def mcsa(models: Sequence[dict[str, np.ndarray]], sigma: float, mode: str = "layer",
         sizes: Sequence[float] | None = None, aggregation: str = "attention", size_weighting: bool = False
         ) -> tuple[list[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """One FedMCSA server step over the sampled clients' models (same keys and shapes each).

    Parameters
    ----------
    models : list of dict
        The S sampled clients' models (state-dict key -> array), in a fixed client order.
    sigma : float
        Scale of the cosine similarity (sigma = 0: the plain mean; large: each client keeps itself).
    mode : {"layer", "tensor"}
        What a component is (see ``components``).
    sizes : list of float, optional
        Training-set sizes n_k; needed for ``size_weighting`` and for ``aggregation="mean"``.
    aggregation : {"attention", "mean"}
        Eq. 7's attention, or the n_k-weighted mean of the ablation FedMCSA without MCSA.
    size_weighting : bool
        Reweight the attention by n_k (the authors' code; ``size_weighted``).

    Returns
    -------
    tuple[list of dict, dict]
        Each client's personalised model W_i (same keys, shapes and dtypes as its input) and the
        S x S weight matrix Psi_l of every component.
    """
    if not models:
        return [], {}
    if aggregation not in ("attention", "mean"):
        raise ValueError(f"aggregation must be 'attention' or 'mean', got {aggregation!r}")
    if (aggregation == "mean" or size_weighting) and (sizes is None or len(sizes) != len(models)):
        raise ValueError("the mean and size weighting need one training-set size per model")
    mixed_of: list[dict[str, np.ndarray]] = [{} for _ in models]
    matrices: dict[str, np.ndarray] = {}
    from fedstrategies import pairwise  # imported on use (torch): every ClientApp imports this module

    def weights_of(gram):
        if aggregation == "mean":
            return mean_weights(sizes)
        psi = _attention_of_gram(gram, sigma)
        return size_weighted(psi, sizes) if size_weighting else psi

    for name, keys in components(models[0], mode).items():
        x = stack_component(models, keys)
        # one upload of x for the attention's Gram matrix (float64) and the mixing product
        psi, mixed = pairwise.gram_and_mix(x, weights_of, None if aggregation == "mean" else "float64")
        matrices[name] = psi
        start = 0
        for key in keys:
            shape, size = models[0][key].shape, models[0][key].size
            for i, model in enumerate(mixed_of):
                model[key] = mixed[i, start:start + size].reshape(shape).astype(models[i][key].dtype, copy=False)
            start += size
    # in the input's key order; non-float tensors (counters) stay each client's own
    out = [{k: new.get(k, np.array(v)) for k, v in model.items()} for new, model in zip(mixed_of, models)]
    return out, matrices
