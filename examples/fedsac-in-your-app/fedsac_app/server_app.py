"""The ServerApp: FedSaC's strategy from pfl-flower run by Flower's own loop, ``strategy.start``."""
import uuid
from logging import INFO

from flwr.app import ArrayRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedcore.config import Config
from fedcore.models import model_facts
from fedstrategies.fedsac import FedSaCStrategy
from server_app.nodes import Membership

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> dict:
    cfg = Config.from_run_config(context.run_config)  # validated: a wrong key stops here
    clients, input_shape, num_classes = Membership(grid, cfg).connect()  # who holds which partition
    strategy = FedSaCStrategy(cfg, clients, model_facts(cfg["model"], input_shape, num_classes, cfg["seed"]))
    strategy.run_token = uuid.uuid4().hex  # clients keep their state under it between rounds
    result = strategy.start(grid, ArrayRecord(), num_rounds=cfg["num-server-rounds"], timeout=cfg["round-timeout"])
    final = dict(result.evaluate_metrics_clientapp[cfg["num-server-rounds"]])
    log(INFO, "FedSaC on %s clients: personalised accuracy %.4f (sample-weighted) after %s rounds",
        len(clients), final["acc-weighted"], cfg["num-server-rounds"])
    return final
