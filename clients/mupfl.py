"""MuPFL client (mupfl.md section 3): PKCF classifier pre-training on the federated features, local
training with BAVD, then the upload of the model, the head it started from, the activation maps and
the per-class classifier gradients.

Client state: the latest post-training model (evaluated, and its head starts the next PKCF
pre-training), one activation map per BAVD layer, the BAVD step counter lambda and the previous
batch loss, all kept across rounds.
"""

from __future__ import annotations

import torch

from clients import bavd as bavd_rules
from clients.base import ClientEnv, ClientMethod, EvalResult
from clients.training import evaluate_model
from fedcore import class_gradients as cg
from fedcore import wire
from fedcore.methods.mupfl import BAVD_KEEP, FEATURES, GRADIENTS, HAS_FEATURES, MAPS, START_HEAD
from fedcore.models import HEAD_PREFIX, bavd_map_shapes, bavd_sites

MODEL = "model"  # state: the latest post-training model
BAVD_MAPS = "bavd-maps"  # state: the activation maps, keys "0", "1", ...
BAVD_COUNTERS = "bavd"  # state: {"steps": lambda, "previous-loss": l^(lambda-1)}
PKCF_TAG, SAMPLE_TAG, EVAL_PKCF_TAG = 1, 2, 3  # shuffle streams apart from local training's (tag 0)


def sample_per_class(data, per_class: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``per_class`` random training samples of every class present (MuPFL's C_i, CReFF's batch_real)."""
    y = data.y_train
    perm = torch.randperm(len(y), generator=generator).to(y.device)
    perm = perm[torch.argsort(y[perm], stable=True)]  # grouped by class, random within
    counts = torch.bincount(y, minlength=data.num_classes)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(len(y), device=y.device) - starts[y[perm]]
    keep = perm[rank < per_class]
    return data.x_train[keep], y[keep]


class BAVD:
    """Biased activation value dropout on a model's BAVD sites (forward hooks, the model is unchanged).

    Each site's output h (post-activation, B x C x H x W) is multiplied by the mask of its map,
    broadcast over batch and channels, without rescaling; the mask comes from the map as it was
    before the batch. While ``recording``, every forward keeps the batch's pre-mask mean r over
    batch and channels, and ``after_step`` (the training loop's callback, with the batch loss)
    folds it into the map: Eq. 6 with psi = the loss change since the previous step.
    """

    def __init__(self, model: torch.nn.Module, maps: list[torch.Tensor], steps: int, previous_loss: float,
                 psi_sign: str):
        self.maps = maps
        self.steps = steps
        self.previous_loss = previous_loss
        self.psi_sign = psi_sign
        self.recording = False
        self._refresh_masks()
        self._batch_means: list[torch.Tensor | None] = [None] * len(maps)
        self._hooks = [site.register_forward_hook(self._hook(i)) for i, site in enumerate(bavd_sites(model))]

    @classmethod
    def from_state(cls, env: ClientEnv, model: torch.nn.Module, psi_sign: str) -> "BAVD":
        """The maps and counters kept in client state; zero maps (BAVD = identity) the first time."""
        saved = env.load_arrays(BAVD_MAPS)
        shapes = bavd_map_shapes(model, env.data.input_shape)
        if saved is None:
            maps = [torch.zeros(shape, device=env.device) for shape in shapes]
        else:
            maps = [wire.to_device(saved[str(i)], env.device) for i in range(len(shapes))]
        counters = env.load_scalars(BAVD_COUNTERS) or {"steps": 0, "previous-loss": 0.0}
        return cls(model, maps, int(counters["steps"]), float(counters["previous-loss"]), psi_sign)

    def save(self, env: ClientEnv) -> None:
        env.save_arrays(BAVD_MAPS, {str(i): m for i, m in enumerate(self.maps)})
        env.save_scalars(BAVD_COUNTERS, {"steps": self.steps, "previous-loss": self.previous_loss})

    def _refresh_masks(self) -> None:
        self.masks = [bavd_rules.bavd_mask(m) for m in self.maps]
        self._drops = [not bool(mask.all()) for mask in self.masks]

    def _hook(self, i: int):
        def hook(_module, _inputs, output):
            if self.recording:
                self._batch_means[i] = output.detach().mean(dim=(0, 1))
            if self._drops[i]:
                return output.masked_fill(~self.masks[i], 0.0)
            return None  # a keep-everything mask: the output itself, untouched

        return hook

    def after_step(self, _step: int, loss: torch.Tensor, _batch) -> None:
        """Map update after the optimiser step, with this batch's loss (mupfl.md 3.3c)."""
        loss = float(loss)
        psi = bavd_rules.loss_change(self.previous_loss, loss, self.psi_sign) if self.steps > 0 else 0.0
        self.maps = [bavd_rules.update_map(m, r, self.steps, psi) for m, r in zip(self.maps, self._batch_means)]
        self.previous_loss = loss
        self.steps += 1
        self._refresh_masks()

    def keep_fraction(self) -> float:
        """Share of positions kept, averaged over the BAVD layers (1 without layers)."""
        if not self.masks:
            return 1.0
        return float(sum(m.float().mean() for m in self.masks) / len(self.masks))

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


class MuPFLClient(ClientMethod):
    # ------------------------------------------------------------------ PKCF
    def pkcf_active(self) -> bool:
        """Head pre-training runs when PKCF is on, the message carries H (its flag), m > 0 and tau > 0."""
        hp = self.hp
        return bool(hp["pkcf"] and self.env.config[HAS_FEATURES] and hp["features-per-class"] > 0
                    and hp["head-epochs"] > 0)

    def pretrain_head(self, model, content, tag: int) -> None:
        """Eq. 21: tau epochs of SGD on the classifier alone over (H, y_H); the extractor is never
        touched (only the head's parameters are in the optimiser, and H never enters the body)."""
        features = wire.unpack_arrays(content[FEATURES])[wire.FEATURES]
        H = wire.to_device(features, self.env.device)  # a copy of the read-only view
        labels = cg.synthetic_labels(self.data.num_classes, self.hp["features-per-class"], self.env.device)
        if len(H) != len(labels):
            raise ValueError(f"federated features have {len(H)} rows, expected {len(labels)}")
        self.train(model.head, x=H, y=labels, epochs=self.hp["head-epochs"], tag=tag)

    def head_to_pretrain(self, received_head: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The head PKCF starts from (``pkcf-head``): ``stored``, v_i, the head this client's last local
        training ended with (saved with its model), else the received v_glo; ``received``, v_glo; ``fresh``,
        the seeded initial head."""
        choice = self.hp["pkcf-head"]
        if choice == "fresh":
            return self.new_model().head.state_dict()
        if choice == "stored":
            previous = self.new_model()
            if self.env.load_module(MODEL, previous):
                return previous.head.state_dict()
        return received_head

    def sample_per_class(self) -> tuple[torch.Tensor, torch.Tensor]:
        """C_i: up to ``samples-per-class`` random training samples of every class present."""
        return sample_per_class(self.data, self.hp["samples-per-class"], self.env.generator(SAMPLE_TAG))

    def class_gradients(self, model, head: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 16 at the classifier ``head``: per-class mean CE gradients of the trained extractor's
        features (eval mode), in closed form."""
        x, y = self.sample_per_class()
        model.eval()
        with torch.no_grad():
            h = model.features(x)
        return cg.class_gradients(h, y, head["weight"], head["bias"], self.data.num_classes)

    # ------------------------------------------------------------------ round
    def fit(self, content):
        hp = self.hp
        model = self.model_from(content, wire.WEIGHTS)
        received_head = {k: v.detach().clone() for k, v in model.head.state_dict().items()}
        if self.pkcf_active():
            model.head.load_state_dict(self.head_to_pretrain(received_head))
            self.pretrain_head(model, content, PKCF_TAG)
        start_head = {HEAD_PREFIX + k: v.detach().clone() for k, v in model.head.state_dict().items()}

        bavd = BAVD.from_state(self.env, model, hp["psi-sign"]) if hp["bavd"] else None
        if bavd is not None:
            bavd.recording = True
        loss = self.train(model, after_step=bavd.after_step if bavd is not None else None)
        upload = {wire.WEIGHTS: wire.pack_arrays(model.state_dict())}
        metrics = {wire.TRAIN_LOSS: loss}
        if bavd is not None:
            bavd.recording = False
            if bavd.maps:
                upload[MAPS] = wire.pack_arrays({str(i): m for i, m in enumerate(bavd.maps)})
            metrics[wire.METHOD_METRIC_PREFIX + BAVD_KEEP] = bavd.keep_fraction()
            bavd.save(self.env)
            if not hp["bavd-at-eval"]:  # the gradients below see the model as it is evaluated
                bavd.remove()
        if hp["pkcf"]:
            ref = received_head if hp["z-ref"] == "global" else {k: v.detach() for k, v in model.head.state_dict().items()}
            z, present = self.class_gradients(model, ref)
            upload[START_HEAD] = wire.pack_arrays(start_head)
            upload[GRADIENTS] = wire.pack_arrays({"z": z, "present": present.to(torch.float32)})
        if bavd is not None:
            bavd.remove()
        self.save_model(model, MODEL)
        return upload, metrics

    def evaluation_model(self, content):
        """The client's latest post-training model; a client that never trained takes the global
        model with its PKCF head (mupfl.md 6)."""
        model = self.new_model()
        if not self.env.load_module(MODEL, model):
            model = self.model_from(content, wire.WEIGHTS)
            if self.pkcf_active():
                self.pretrain_head(model, content, EVAL_PKCF_TAG)
        return model

    def evaluate(self, content):
        return self.evaluate_splits(content)[0]

    def evaluate_splits(self, content):
        """Test and validation scores of one evaluation model. The base builds it once per split; here the
        PKCF head pre-training of a client that never trained (tau epochs, seeded by its tag, so both builds
        were the same model) runs once: it was most of an evaluation round. BAVD masks apply per
        ``bavd-at-eval``."""
        model = self.evaluation_model(content)
        bavd = (BAVD.from_state(self.env, model, self.hp["psi-sign"])
                if self.hp["bavd"] and self.hp["bavd-at-eval"] else None)
        data = self.data
        try:
            test = EvalResult(*evaluate_model(model, data.x_test, data.y_test))
            val = EvalResult(*evaluate_model(model, data.x_val, data.y_val)) if data.num_val else None
        finally:
            if bavd is not None:
                bavd.remove()
        return test, val
