"""One-off studies: each answers one question of one paper page (why FedSaC's self-weight collapses, how
Per-FedAvg's score depends on its adaptation batches, FedFCD's bytes, MuPFL's matching, CUDA against CPU) and
rebuilds its own table with ``python -m benchmarks.studies.<name>``. The general tools stay in benchmarks/."""
