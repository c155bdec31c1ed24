"""The method registry: one entry per method, naming its server strategy and its client.

Adding a method = its declaration in fedcore/methods/ (message contract, ``HPARAMS``, ``PAPER_SETTINGS``), a
module in fedstrategies/ (Strategy subclass), a module in clients/ (ClientMethod subclass) and one ``Method``
line below (docs/adding-a-method.md). Classes are imported lazily, so that the server never needs a method's
client code loaded to validate a config, and vice versa; the run-config schema imports the plain declarations
only (no torch, no Flower).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cached_property


def _load(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    strategy_path: str  # "module:Class" of the server Strategy
    client_path: str  # "module:Class" of the ClientMethod
    declaration_path: str = ""  # its declaration module; default fedcore.methods.<the strategy's module name>

    @cached_property
    def strategy(self):
        return _load(self.strategy_path)

    @cached_property
    def client(self):
        return _load(self.client_path)

    @property
    def declaration(self):
        """The method's plain declaration module (contract, ``HPARAMS``, ``PAPER_SETTINGS``)."""
        default = "fedcore.methods." + self.strategy_path.split(":")[0].rpartition(".")[2]
        return importlib.import_module(self.declaration_path or default)

    @property
    def hparams(self) -> dict:
        """The method's hyperparameters (run-config keys ``<name>.<key>``), from its declaration."""
        return self.declaration.HPARAMS


def _entries(*methods: Method) -> dict[str, Method]:
    return {m.name: m for m in methods}


REGISTRY: dict[str, Method] = _entries(
    Method("local", "each client trains alone, no communication",
           "fedstrategies.local:LocalStrategy", "clients.local:LocalClient"),
    Method("fedavg", "FedAvg (McMahan et al. 2017): one global model",
           "fedstrategies.fedavg:FedAvgStrategy", "clients.fedavg:FedAvgClient"),
    Method("fedavg-ft", "FedAvg, then each client fine-tunes the global model before evaluating",
           "fedstrategies.fedavg_ft:FedAvgFTStrategy", "clients.fedavg_ft:FedAvgFTClient"),
    Method("fedprox", "FedProx (Li et al. 2020): FedAvg with a proximal term in local training",
           "fedstrategies.fedprox:FedProxStrategy", "clients.fedprox:FedProxClient"),
    Method("fedproto", "FedProto (Tan et al. 2022): class prototypes exchanged, no weights",
           "fedstrategies.fedproto:FedProtoStrategy", "clients.fedproto:FedProtoClient"),
    Method("fedper", "FedPer (Arivazhagan et al. 2019): shared body, private head",
           "fedstrategies.fedper:FedPerStrategy", "clients.fedper:FedPerClient"),
    Method("fedrep", "FedRep (Collins et al. 2021): head epochs then body epochs, body shared",
           "fedstrategies.fedrep:FedRepStrategy", "clients.fedrep:FedRepClient"),
    Method("ditto", "Ditto (Li et al. 2021): personal model with a proximal pull to the global one",
           "fedstrategies.ditto:DittoStrategy", "clients.ditto:DittoClient"),
    Method("fedmcsa", "FedMCSA (Guo et al. 2023): per-layer self-attention across clients' models on the server",
           "fedstrategies.fedmcsa:FedMCSAStrategy", "clients.fedmcsa:FedMCSAClient"),
    Method("majority", "each client predicts its most frequent training label (no training, no communication)",
           "fedstrategies.majority:MajorityStrategy", "clients.majority:MajorityClient"),
    Method("pfedpm", "pFedPM (Xing et al.): class features mixed with global ones (a), relation module, no weights",
           "fedstrategies.pfedpm:PFedPMStrategy", "clients.pfedpm:PFedPMClient"),
    Method("fedfcd", "FedFCD (Li et al. 2024): feature alignment, server-trained global head, decision fusion",
           "fedstrategies.fedfcd:FedFCDStrategy", "clients.fedfcd:FedFCDClient"),
    Method("mupfl", "MuPFL (Zhang et al. 2023): activation dropout, clustered updates, classifier tuning on federated features",
           "fedstrategies.mupfl:MuPFLStrategy", "clients.mupfl:MuPFLClient"),
    Method("creff", "CReFF (Shang et al. 2022): FedAvg, classifier re-trained on gradient-matched federated features",
           "fedstrategies.creff:CReFFStrategy", "clients.creff:CReFFClient"),
    Method("fedsac", "FedSaC (Yan et al. 2024): per-client models mixed by a similarity/complementarity graph",
           "fedstrategies.fedsac:FedSaCStrategy", "clients.fedsac:FedSaCClient"),
    Method("pfedgraph", "pFedGraph (Ye et al. 2023): per-client models mixed by a graph inferred from model similarity",
           "fedstrategies.pfedgraph:PFedGraphStrategy", "clients.pfedgraph:PFedGraphClient"),
    Method("per-fedavg", "Per-FedAvg (Fallah et al. 2020): MAML meta-steps, one adaptation step before evaluation",
           "fedstrategies.per_fedavg:PerFedAvgStrategy", "clients.per_fedavg:PerFedAvgClient"),
    Method("pfedme", "pFedMe (Dinh et al. 2020): Moreau-envelope personal models, server beta-mixing",
           "fedstrategies.pfedme:PFedMeStrategy", "clients.pfedme:PFedMeClient"),
    Method("l2gd", "L2GD (Hanzely & Richtarik 2020): loopless local GD with random averaging steps",
           "fedstrategies.l2gd:L2GDStrategy", "clients.l2gd:L2GDClient"),
    Method("fednova", "FedNova (Wang et al. 2020): updates normalised by effective local steps",
           "fedstrategies.fednova:FedNovaStrategy", "clients.fednova:FedNovaClient"),
    Method("fedgh", "FedGH (Yi et al. 2023): global header trained on the server from class prototypes, replaces each client's",
           "fedstrategies.fedgh:FedGHStrategy", "clients.fedgh:FedGHClient"),
    Method("fedrod", "FedRoD (Chen & Chao 2022): balanced-softmax generic model plus a personal head, logits summed",
           "fedstrategies.fedrod:FedRoDStrategy", "clients.fedrod:FedRoDClient"),
    Method("gpfl", "GPFL (Zhang et al. 2023): global extractor, CoV and GCE; personal head on the valve's personal route",
           "fedstrategies.gpfl:GPFLStrategy", "clients.gpfl:GPFLClient"),
    Method("fedamp", "FedAMP (Huang et al. 2021): cloud models by attentive message passing over model distances",
           "fedstrategies.fedamp:FedAMPStrategy", "clients.fedamp:FedAMPClient"),
    Method("heurfedamp", "HeurFedAMP (Huang et al. 2021): FedAMP with a fixed self-weight and cosine attention",
           "fedstrategies.heurfedamp:HeurFedAMPStrategy", "clients.fedamp:HeurFedAMPClient"),
    Method("cfl", "CFL (Sattler et al. 2020): clusters split in two by the cosine of their members' updates",
           "fedstrategies.cfl:CFLStrategy", "clients.cfl:CFLClient"),
    Method("fesem", "FeSEM (Long et al. 2023): K centre models, clients assigned by stochastic EM on model distance",
           "fedstrategies.fesem:FeSEMStrategy", "clients.fesem:FeSEMClient"),
)


def get_method(name: str) -> Method:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose one of: {', '.join(REGISTRY)}") from None
