"""How far one round of gradient matching moves the federated features at d = 3136 (issue #27 item 1).

Class gradients of 4 clients' real mnist5k features (320 random images each) through MuPFL's CNN at its seeded
initial weights are averaged as the server does; H (1,000 x 3136, N(0, 1)) is matched for 100 steps with each
optimiser, twice (two rounds of the same target). Prints the mean matching distance before and after.

    python -m benchmarks.studies.mupfl_matching
"""

from __future__ import annotations

import numpy as np
import torch

from fedcore import class_gradients as cg
from fedcore.models import build_model
from fedstrategies import federated_features as ff
from partitions import load_dataset


def main() -> None:
    torch.set_num_threads(1)
    data = load_dataset("mnist5k", num_clients=20, seed=0)
    x, y = torch.tensor(data.x, dtype=torch.float32), torch.tensor(data.y).long()
    torch.manual_seed(0)
    model = build_model("mupflcnn", tuple(x.shape[1:]), 10).eval()
    W, b = model.head.weight.detach(), model.head.bias.detach()
    rng = np.random.default_rng(0)
    replies = []
    for _ in range(4):
        idx = torch.from_numpy(rng.choice(len(y), 320, replace=False))
        with torch.no_grad():
            z, present = cg.class_gradients(model.features(x[idx]), y[idx], W, b, 10)
        replies.append((z.numpy(), present.numpy()))
    z, reported = ff.average_class_gradients(replies)
    z, reported = torch.from_numpy(z.astype(np.float32)), torch.from_numpy(reported)
    for optimizer, lr in (("adam", 0.01), ("sgd", 0.1), ("sgd", 0.01)):
        H = torch.randn(1000, model.feature_dim, generator=torch.Generator().manual_seed(0))
        before, after = ff.match_features(H, z, reported, W, b, 100, lr, optimizer)
        _, again = ff.match_features(H, z, reported, W, b, 100, lr, optimizer)
        print(f"d={model.feature_dim} m=100 {optimizer} step {lr}: round 1 {before:.4f} -> {after:.4f}, "
              f"round 2 -> {again:.4f}")


if __name__ == "__main__":
    main()
