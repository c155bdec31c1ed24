"""FedPer (Arivazhagan et al., 2019): FedAvg over the body only; each client keeps its own head."""

from fedcore.models import BODY_PREFIX
from fedstrategies.fedavg import FedAvgStrategy


class FedPerStrategy(FedAvgStrategy):
    """Averages and sends only ``body.*`` tensors: heads never cross the wire."""

    def is_shared(self, key: str) -> bool:
        return key.startswith(BODY_PREFIX)
