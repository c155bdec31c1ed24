"""FedNova's effective step count, computed by the client (what it sends) and the server (its bound).

Local SGD with momentum rho (torch's: buf <- rho buf + g, x <- x - lr buf, buf starting at the first
gradient) over tau steps moves x by lr * sum_j a_j g_j with a_j = (1 - rho^(tau - j + 1)) / (1 - rho), so
||a||_1 = sum_{k=1..tau} (1 - rho^k) / (1 - rho) (Wang et al. 2020, Sec. 4 and App.; tau when rho = 0).
"""

from __future__ import annotations


def effective_steps(tau: int, momentum: float) -> float:
    """||a||_1 of tau steps of SGD with momentum ``momentum``, accumulated as the optimiser runs."""
    counter = total = 0.0
    for _ in range(tau):
        counter = momentum * counter + 1.0  # (1 - rho^k) / (1 - rho)
        total += counter
    return total
