"""Wake Flower's simulation engine when the ServerApp has pushed messages, instead of letting it
find them at its next 0.1 s poll.

Flower 1.41's simulation engine runs in the same process as the ServerApp (``flwr-simulation``). One
thread (``vce_api.add_messages_to_queue``) moves new messages from the LinkState to the workers'
queue, then sleeps ``f_stop.wait(0.1)``; there is no setting for that interval. Every phase of every
round therefore started 0 to 0.1 s (0.05 s on average) after the ServerApp sent its messages: twice a
round, 5% of a 20-client mnist5k round and 15% of a 2-client one. A second extracting thread is not an
option: ``get_message_ins`` marks messages delivered outside the state's lock, so two extractors could
both take one message.

``kick()`` finds that thread once, replaces the ``wait`` of its stop event (a plain
``threading.Event`` that only this thread waits on) by a wait on a wake-up event with the same
timeout, and sets the wake-up event; the loop then takes the new messages at once and still polls
every 0.1 s on its own. ``f_stop.set()`` still ends the loop at once (it sets the wake-up event
too). Where the thread is not found (another Flower version, not a simulation), nothing changes.
"""

from __future__ import annotations

import threading

_EXTRACTOR = "add_messages_to_queue"
_WAKE = "_pfl_wake"  # the wake-up event, kept on the stop event it belongs to


def _extractor_stop_event() -> threading.Event | None:
    for thread in threading.enumerate():
        target = getattr(thread, "_target", None)
        args = getattr(thread, "_args", ())
        if (getattr(target, "__name__", "") == _EXTRACTOR and "vce" in getattr(target, "__module__", "")
                and len(args) >= 4 and isinstance(args[3], threading.Event)):
            return args[3]
    return None


def _hook(f_stop: threading.Event) -> threading.Event:
    wake = threading.Event()

    def wait(timeout: float | None = None) -> bool:
        if timeout is None:
            return threading.Event.wait(f_stop)
        wake.wait(timeout)
        wake.clear()
        return f_stop.is_set()

    def stop() -> None:
        threading.Event.set(f_stop)
        wake.set()  # the loop ends now, not after its wait

    f_stop.wait = wait  # instance attributes: the running loop looks them up at every pass
    f_stop.set = stop
    return wake


def kick() -> bool:
    """Wake the simulation engine's message mover; False where there is none in this process."""
    f_stop = _extractor_stop_event()
    if f_stop is None:
        return False
    wake = getattr(f_stop, _WAKE, None)
    if wake is None:
        wake = _hook(f_stop)
        setattr(f_stop, _WAKE, wake)
    wake.set()
    return True
