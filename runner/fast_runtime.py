"""Flower's SuperNode and SuperExec with the waits of a deployed round taken out (opt-in).

Where a deployed round's time goes in Flower 1.41 (measured, see README "Deployment"):

* an idle SuperNode sleeps a hard-coded 3 s between polls of the SuperLink
  (``flwr/supernode/start_client_internal.py``), and waits for its ClientApp's reply in 0.5 s steps;
  neither has a flag or an environment variable;
* the SuperExec starts a fresh ``flwr-clientapp`` process for every message, which pays Python's
  start and the torch + flwr imports (2-4 s here) before the message is even read; its task poll is
  Flower's own setting ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (default 1 s);
* the ServerApp's ``Grid.send_and_receive`` pulls replies every 3 s (our ServerApp polls itself
  instead: ``server_app.nodes.send_and_receive``);
* whoever pulls a message's objects (SuperNode from the SuperLink, ClientApp from its SuperNode,
  ServerApp from the SuperLink) and asks before they are all there waits Flower's first back-off,
  1 s (``fedcore.flower_patches.object_pulls``);
* every ClientApp unzips and hash-checks the run's FAB again before it finds it installed, and
  builds its first optimizer, which imports ``torch._dynamo`` (1.4 to 2.2 s).

``python -m runner.fast_runtime supernode <flower-supernode args>`` is ``flower-supernode`` with
those sleeps shortened: its idle poll backs off from 10 ms after work to ``PFL_SUPERNODE_POLL_S``
(default 0.2 s). ``python -m runner.fast_runtime superexec <flower-superexec args>`` is
``flower-superexec`` that imports torch and Flower's ClientApp runtime once and forks each ClientApp
from itself: the same ``run_clientapp`` Flower runs, with the same token and Runtime API, only
without a cold interpreter, with object pulls retried after 10 ms, an installed FAB not unpacked
again, and its ask for the next task woken when a ClientApp ends. The app itself is still imported
fresh in every fork from the FAB of its run, so a new FAB is never served by old code. Everything
else (TLS, authentication, node config) is Flower's own; both accept exactly Flower's flags. The
changes to Flower's internals are ``fedcore.flower_patches``', which refuse a Flower they were not
written for; both commands mark their processes (and the ClientApps they fork) ``PFL_RUNTIME=fast``.
"""

from __future__ import annotations

import importlib
import os
import select
import signal
import sys
import time
import traceback

from fedcore import flower_patches

POLL_ENV = "PFL_SUPERNODE_POLL_S"
PRELOAD_ENV = "PFL_SUPEREXEC_PRELOAD"
DEFAULT_POLL_S = 0.2
# heavy libraries every ClientApp of this project imports: loaded once in the SuperExec, shared by forks.
# torch._dynamo is imported by the first optimizer a process builds (torch.optim wraps Optimizer.__init__
# with it): 1.4 to 2.2 s that every forked training task paid before it was preloaded here.
DEFAULT_PRELOAD = "numpy,torch,torch.nn,torch.optim,torch._dynamo,flwr.app,flwr.clientapp"
# Flower's own setting for the task poll of Flower's SuperExec (the ones a SuperLink starts: the
# simulation's, set to FAST_TASK_POLL_S by the launcher, and a deployment's, SERVERAPP_TASK_POLL_S)
TASK_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
FAST_TASK_POLL_S = "0.1"
# the forking SuperExec's longest wait between asks for a task (``_TaskPoll``; replaces Flower's fixed interval)
TASK_POLL_CAP_ENV = "PFL_SUPEREXEC_POLL_S"
DEFAULT_TASK_POLL_CAP_S = 0.2
# the SuperLink's SuperExec, which only starts each run's ServerApp: at 0.1 s its polls were a sixth of
# the SuperLink's requests during a deployed round (10 a second, each a few ms of the SuperLink's CPU)
SERVERAPP_TASK_POLL_S = "0.5"
# longest wait between a ClientApp's retries of message objects from its own SuperNode (a local call)
LOCAL_PULL_CAP_S = 0.02


def install_fab_once(install):
    """Flower's ``install_from_fab``, skipped when this FAB (by its hash) is installed already, and
    byte-compiled when it is installed.

    Flower unzips the FAB into a temporary folder and checks every file's hash on every message,
    0.2 to 0.4 s here, and only then finds the app installed and returns its folder. That folder is
    named by the FAB's hash, so an existing one holds these very bytes. Each forked ClientApp imports
    the app afresh from that folder; where ``PYTHONDONTWRITEBYTECODE`` is set (as on our CI machines)
    nothing caches the compiled modules and every task compiled the app's sources again (50 ms), so
    the folder gets its ``__pycache__`` once, here (reading it is allowed under that setting).
    """
    import compileall
    import hashlib

    from flwr.common.constant import APP_DIR, FAB_HASH_TRUNCATION
    from flwr.supercore.utils import get_flwr_home

    def install_once(fab_content: bytes, skip_prompt: bool = False, **kwargs):
        digest = hashlib.sha256(fab_content).hexdigest()[:FAB_HASH_TRUNCATION]
        installed = sorted((get_flwr_home() / APP_DIR).glob(f"*.{digest}"))
        if installed and skip_prompt and not kwargs:
            return installed[0]
        folder = install(fab_content, skip_prompt=skip_prompt, **kwargs)
        if folder is not None:
            compileall.compile_dir(str(folder), quiet=2)
        return folder

    return install_once


class _Backoff:
    """A wait that starts at ``first`` after work and grows 1.5x per idle wait up to ``cap``."""

    def __init__(self, first: float, cap: float):
        self.first, self.cap = min(first, cap), cap
        self.delay = self.first

    def reset(self) -> None:
        self.delay = self.first

    def take(self) -> float:
        """The wait to make now; the next one is longer."""
        delay, self.delay = self.delay, min(self.delay * 1.5, self.cap)
        return delay


class _CappedSleep:
    """Stands in for the ``time`` module inside Flower's SuperNode loop.

    Flower 1.41 sleeps there twice: 3 s between polls of the SuperLink when no message came (a
    network call), and 0.5 s steps while it waits on its own state for the ClientApp's reply or an
    object to push (an in-memory look-up: capped at ``local_cap``, 10 ms; at 0.2 s the reply of every
    task waited 0.1 s on average before it left the node).

    The idle poll backs off: ``first`` after the node has done something (a task, a push: anything
    that kept it away from polling longer than its last wait), then 1.5 times longer each time up to
    ``cap``. The server's next message usually follows a node's reply within a fraction of a second
    (aggregation, then evaluation or the next round), so it is seen within a few tens of ms, while an
    idle node still polls only every ``cap`` seconds. A fixed 0.2 s made every message wait 0.1 s on
    average before its node took it, twice a round.
    """

    def __init__(self, cap: float, local_cap: float = 0.01, first: float = 0.01, clock=time.monotonic):
        self.local_cap, self.clock = local_cap, clock
        self.backoff, self.last_poll = _Backoff(first, cap), None  # idle waits; when the last one ended

    def sleep(self, seconds: float) -> None:
        if seconds < 1:
            time.sleep(min(seconds, self.local_cap))
            return
        now = self.clock()
        if self.last_poll is None or now - self.last_poll > self.backoff.delay + 0.05:  # busy since
            self.backoff.reset()
        time.sleep(min(seconds, self.backoff.take()))
        self.last_poll = self.clock()

    def __getattr__(self, name: str):
        return getattr(time, name)


def supernode(argv: list[str]) -> None:
    """``flower-supernode`` whose idle poll backs off from 10 ms to ``PFL_SUPERNODE_POLL_S`` and whose
    waits for its ClientApp's reply are 10 ms."""
    from flwr.supernode.cli.flower_supernode import flower_supernode

    cap = float(os.environ.get(POLL_ENV, DEFAULT_POLL_S))
    os.environ[flower_patches.RUNTIME_ENV] = flower_patches.FAST
    flower_patches.supernode_sleep(_CappedSleep(cap))
    flower_patches.object_pulls(cap)
    sys.argv = ["flower-supernode", *argv]
    flower_supernode()


class ForkExecutor:
    """SuperExec executor that forks ClientApps from this (pre-imported) process; other task types
    (the ServerApp) go to Flower's own executor."""

    def __init__(self, fallback, task_ended_fd: int | None = None):
        self.fallback = fallback
        self.children: set[int] = set()
        self.task_ended_fd = task_ended_fd  # each forked ClientApp writes a byte here as it ends

    def get_eligible_capacity(self, supported_task_types, **kwargs):
        return self.fallback.get_eligible_capacity(supported_task_types, **kwargs)

    def wait_for_capacity(self, task_type=None, **kwargs) -> None:
        self.fallback.wait_for_capacity(task_type, **kwargs)

    def launch(self, spec):
        from flwr.supercore.constant import TaskType
        from flwr.supercore.superexec.executor.types import LaunchResult

        if spec.task_type != TaskType.CLIENT_APP:
            return self.fallback.launch(spec)
        self.reconcile()
        pid = os.fork()
        if pid == 0:  # the child never returns
            _run_clientapp_child(spec, self.task_ended_fd)
        self.children.add(pid)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap finished ClientApps (no zombies)."""
        for pid in list(self.children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.children.discard(pid)
        self.fallback.reconcile()

    def close(self) -> None:
        self.fallback.close()


class _TaskPoll:
    """Stands in for the ``time`` module inside Flower's SuperExec loop, which sleeps a fixed
    ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` between asks for a task, busy or not (0.1 s here before).

    A node's next message comes after its ClientApp's reply has gone to the ServerApp and the
    ServerApp has sent again: the wait is woken when a forked ClientApp ends (a byte on a pipe),
    then grows from ``first`` by 1.5x per empty ask to ``cap`` (``PFL_SUPEREXEC_POLL_S``, 0.2 s).
    The next task is then taken within a few tens of ms of its arrival, and a node whose ClientApp
    trains asks rarely (each ask is a request its SuperNode answers on the same cores).
    """

    def __init__(self, task_ended_fd: int, first: float = 0.01, cap: float = 0.2):
        self.fd, self.backoff = task_ended_fd, _Backoff(first, cap)
        os.set_blocking(task_ended_fd, False)

    @property
    def delay(self) -> float:
        return self.backoff.delay

    def sleep(self, seconds: float) -> None:  # Flower's fixed interval is replaced, not capped
        ready, _, _ = select.select([self.fd], [], [], self.backoff.take())
        if ready:
            try:
                while os.read(self.fd, 4096):
                    pass
            except BlockingIOError:
                pass
            self.backoff.reset()

    def __getattr__(self, name: str):
        return getattr(time, name)


def _run_clientapp_child(spec, task_ended_fd: int | None = None) -> None:
    """Body of a forked ClientApp: Flower's ``run_clientapp`` with the parent's handlers dropped."""
    code, start, log_fd = 1, time.monotonic(), os.dup(2)  # the SuperExec's own log, even when output is suppressed
    try:
        from flwr.supercore.exit import exit_handler
        from flwr.supercore.tls import validate_and_resolve_root_certificates
        from flwr.supernode.runtime.run_clientapp import run_clientapp  # imported (and patched) by the SuperExec

        exit_handler.registered_exit_handlers.clear()  # the SuperExec's, not this task's
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_DFL)
        if spec.suppress_output:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
        run_clientapp(
            runtime_api_address=spec.runtime_api_address,
            token=spec.token,
            insecure=spec.insecure,
            certificates=validate_and_resolve_root_certificates(spec.root_certificates_path, spec.insecure),
            parent_pid=spec.parent_pid,
            runtime_dependency_install=spec.runtime_dependency_install,
        )
        code = 0
    except SystemExit as exc:  # flwr_exit ends every task with sys.exit
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a task must never return into the SuperExec's loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(log_fd, f"[fast_runtime] ClientApp task {spec.task_id} (forked) ended with {code} after "
                         f"{time.monotonic() - start:.2f} s\n".encode())
        if task_ended_fd is not None:
            try:
                os.write(task_ended_fd, b"x")  # the SuperExec polls for this node's next task at once
            except OSError:
                pass
        os._exit(code)


def superexec(argv: list[str]) -> None:
    """``flower-superexec`` that forks each ClientApp from a process with its heavy imports done."""
    for name in filter(None, os.environ.get(PRELOAD_ENV, DEFAULT_PRELOAD).split(",")):
        importlib.import_module(name.strip())
    from flwr.supercore.cli.flower_superexec import flower_superexec

    os.environ[flower_patches.RUNTIME_ENV] = flower_patches.FAST
    # set once here, inherited by every forked ClientApp: its pulls go to its own SuperNode, which
    # is still fetching the message from the SuperLink when the task starts; with the SuperNode's
    # cap (0.2 s) a task waited 0.19 s on average for objects that had arrived long before
    flower_patches.object_pulls(LOCAL_PULL_CAP_S)
    flower_patches.fab_install(install_fab_once)
    task_ended_r, task_ended_w = os.pipe()
    poll = _TaskPoll(task_ended_r, cap=float(os.environ.get(TASK_POLL_CAP_ENV, DEFAULT_TASK_POLL_CAP_S)))
    flower_patches.superexec(lambda executor: ForkExecutor(executor, task_ended_w), poll)
    sys.argv = ["flower-superexec", *argv]
    flower_superexec()


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"supernode": supernode, "superexec": superexec}
    if not argv or argv[0] not in commands:
        sys.exit(f"usage: python -m runner.fast_runtime {{{','.join(commands)}}} <Flower's own flags>")
    commands[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
