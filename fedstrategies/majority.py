"""Majority: each client predicts its most frequent training label; no training, no communication.

The floor for label-skewed splits (Synthetic, 2-class pairs), where a large part of any method's
accuracy comes from knowing which labels a client holds: report each method's gain over it.
"""

from flwr.app import MetricRecord

from fedstrategies.base import PersonalizedStrategy


class MajorityStrategy(PersonalizedStrategy):
    """No train messages at all; every evaluation asks each client to score its majority label."""

    def sample_train(self, server_round):
        return []

    def aggregate_train(self, server_round, replies):
        """Nothing was sent, so there is nothing to validate or aggregate (and no min-replies warning)."""
        return None, MetricRecord({"replies": 0, "dropped": 0})
