"""FedSaC from pfl-flower in a Flower App of your own: data and model in task.py, the apps beside it."""
