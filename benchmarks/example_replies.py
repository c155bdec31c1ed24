"""Realistic replies for the server benchmark (``benchmarks/server_time.py``) and the fuzz and reliability tests,
for strategies whose schema alone does not make a valid reply. Benchmark code: no strategy module imports it."""

from __future__ import annotations

import numpy as np

from fedcore import wire


def mupfl_reply(strategy, pid: int, phase: str, rng) -> dict:
    """MuPFL: noisy weights, 0/1 present-class flags with matching class gradients, the start head, and maps."""
    from fedcore.methods.mupfl import GRADIENTS, MAPS, START_HEAD

    records = {}
    if phase != "train":
        return records
    noisy = {k: (v + 0.01 * rng.standard_normal(v.shape)).astype(v.dtype) if v.dtype.kind == "f" else v
             for k, v in strategy.global_weights.items()}
    records[wire.WEIGHTS] = wire.pack_arrays(noisy)
    if strategy.hp["pkcf"]:
        K, d = strategy.num_classes, strategy.model.feature_dim
        present = (strategy.clients[pid].train_label_counts > 0).astype(np.float32)
        z = rng.standard_normal((K, K * d + K)).astype(np.float32) * present[:, None]
        records[START_HEAD] = wire.pack_arrays({k: strategy.global_weights[k] for k in strategy.head_keys})
        records[GRADIENTS] = wire.pack_arrays({"z": z, "present": present})
    if strategy.map_shapes:
        records[MAPS] = wire.pack_arrays({str(i): rng.random(s).astype(np.float32)
                                          for i, s in enumerate(strategy.map_shapes)})
    return records


def creff_reply(strategy, pid: int, phase: str, rng) -> dict:
    """CReFF: noisy weights and class gradients with 0/1 present-class flags."""
    from fedcore.methods.creff import GRADIENTS

    if phase != "train":
        return {}
    K, d = strategy.num_classes, strategy.model.feature_dim
    present = (strategy.clients[pid].train_label_counts > 0).astype(np.float32)
    noisy = {k: (v + 0.01 * rng.standard_normal(v.shape)).astype(v.dtype) if v.dtype.kind == "f" else v
             for k, v in strategy.global_weights.items()}
    z = rng.standard_normal((K, K * d + K)).astype(np.float32) * present[:, None]
    return {wire.WEIGHTS: wire.pack_arrays(noisy), GRADIENTS: wire.pack_arrays({"z": z, "present": present})}


# strategy class name -> reply builder (checked before the schema's random fill)
EXAMPLE_REPLIES = {"MuPFLStrategy": mupfl_reply, "CReFFStrategy": creff_reply}
