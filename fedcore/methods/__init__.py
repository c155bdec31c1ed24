"""Message contracts: for each method, the names of what its strategy and its client send each way.

A method whose messages carry more than the shared names of ``fedcore.wire`` (the ``weights`` and
``class-features`` records, the base config keys and metrics) declares the rest in a module here,
``fedcore/contracts/<method>.py``, with each item's shape and meaning:

- server -> client: the array records of its train/evaluate (and round-0 prepare) messages and the
  config keys it writes into the message's ``config`` record (flags and modes the client reads);
- client -> server: the array records of its replies and its method metrics (they travel as
  ``wire.METHOD_METRIC_PREFIX + name``; evaluation metrics become ``eval_<name>`` columns).

Both ``fedstrategies/<method>.py`` and ``clients/<method>.py`` import their names from here, so a
ClientApp never imports server strategy code (``tests/test_imports.py`` checks it). These modules
hold plain strings only: a client pays nothing to import them. The keys inside a record (its arrays)
are given with their shapes in each record's comment. Methods that send only ``fedcore.wire`` names
(FedAvg, FedProx, FedPer, FedRep, Ditto, FedAvg+FT, Local, Majority) have no module here.
"""
