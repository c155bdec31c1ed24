"""Method declarations: for each method, one plain module ``fedcore/methods/<name>.py`` that both its strategy and
its client import, holding

- its message contract, beyond the shared names of ``fedcore.wire`` (the ``weights`` and ``class-features``
  records, the base config keys and metrics): server -> client, the array records of its train/evaluate (and
  round-0 prepare) messages and the config keys it writes into the message's ``config`` record; client -> server,
  the array records of its replies and its method metrics (they travel as ``wire.METHOD_METRIC_PREFIX + name``;
  evaluation metrics become ``eval_<name>`` columns). The keys inside a record are given with their shapes in
  each record's comment;
- ``HPARAMS``: its run-config keys ``<name>.<key>`` with their defaults, choices and bounds;
- ``PAPER_SETTINGS`` where the paper fixes the common training keys (``fedcore.paper_settings`` resolves them),
  and any small rule both sides compute the same way;
- its record, the method's only one: ``SUMMARY``, the ``STRATEGY`` and ``CLIENT`` class paths, its ``POSITION``
  in the registry's order, its ``TUNING_GRID`` and, where the reply schema alone makes no valid reply, its
  ``example_reply`` (``fedcore.registry`` scans this package for them; ``make sync-config`` writes ``HPARAMS``
  into pyproject.toml). A module whose name starts with ``_`` holds shared helpers, not a method.

They import neither torch nor Flower, so the run-config schema is built from them in a few ms and a ClientApp
never imports server strategy code (``tests/test_imports.py`` and ``tests/test_config.py`` check both).
"""
