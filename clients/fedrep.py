"""FedRep client: head epochs with the body fixed, then body epochs with the head fixed; uploads the body."""

from clients.fedper import FedPerClient
from clients.training import extract_features

HEAD_TAG = 1


class FedRepClient(FedPerClient):
    def local_train(self, model, content) -> float:
        self.train_head(model)
        return self.train_body(model)

    def train_head(self, model) -> None:
        """Head epochs with the body fixed: its features are computed once and the head trains on them."""
        feats = extract_features(model, self.data.x_train)
        self.train(model.head, x=feats, epochs=self.hp["head-epochs"], tag=HEAD_TAG)

    def train_body(self, model) -> float:
        """Body epochs with the head fixed."""
        model.head.requires_grad_(False)
        loss = self.train(model, params=model.body.parameters())
        model.head.requires_grad_(True)
        return loss
