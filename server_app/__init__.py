"""Server side: the ServerApp alone (round loop, nodes, checkpoints, results).

The tools that start, deploy and compare runs live in ``runner``. ``python -m server_app.<tool>`` (the
Make targets, docs and presets name them so) still runs ``runner/<tool>.py``: the finder below resolves
those names to runner's files, so no second copy of a tool lives here.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

TOOLS = ("launch", "flower_cli", "ray_head", "staged_app", "deploy_local", "docker_stack", "netns", "certs",
         "compare", "inprocess", "fast_runtime")


class _ToolAlias(importlib.abc.MetaPathFinder):
    """``server_app.<tool>`` -> the file of ``runner.<tool>`` (a thin alias for ``python -m``)."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, tool = fullname.rpartition(".")
        if package != __name__ or tool not in TOOLS:
            return None
        origin = importlib.util.find_spec(f"runner.{tool}").origin
        return importlib.util.spec_from_file_location(fullname, origin)


if not any(isinstance(finder, _ToolAlias) for finder in sys.meta_path):
    sys.meta_path.append(_ToolAlias())
