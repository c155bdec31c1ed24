"""Server side: the ServerApp alone (round loop, nodes, checkpoints, results).

The tools that start, deploy and compare runs live in ``runner`` (``python -m runner.<tool>``). Tables made
before the move name them ``python -m server_app.<tool>`` in their "Made by" line: that was the old name.
"""
