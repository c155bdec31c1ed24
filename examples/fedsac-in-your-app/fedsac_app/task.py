"""This app's own data and model, which pfl-flower loads by name (``py:...`` and ``package.module:factory``)."""
import numpy as np
from torch import nn

SIDE = 8  # images are SIDE x SIDE pixels


def stripes(n: int = 800, seed: int = 0):
    """Grey images of four classes: a horizontal, vertical, diagonal or anti-diagonal stripe at a random
    place, on noise. Returns (x uint8 (n, 1, SIDE, SIDE), y)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    x = rng.integers(0, 90, (n, SIDE, SIDE))
    at = rng.integers(0, SIDE, n)
    idx = np.arange(SIDE)
    for i, (label, k) in enumerate(zip(y, at)):
        rows, cols = [(np.full(SIDE, k), idx), (idx, np.full(SIDE, k)), (idx, (idx + k) % SIDE),
                      (idx, (k - idx) % SIDE)][label]
        x[i, rows, cols] = 255
    return x[:, None].astype(np.uint8), y


def small_cnn(input_shape, num_classes):
    """(body, head): the body's output is the feature FedSaC builds its subspaces from."""
    channels, height, width = input_shape
    body = nn.Sequential(nn.Conv2d(channels, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(8 * (height // 2) * (width // 2), 32), nn.ReLU())
    return body, nn.Linear(32, num_classes)
