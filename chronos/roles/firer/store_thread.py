"""What the firer's threads on PostgreSQL have in common (the claimers, the sweepers, the settler): a thread on a store
of its own."""

from __future__ import annotations

import logging
import threading
import time
from typing import Generic, TypeVar

from chronos.config import Settings
from chronos.errors import ConfigError
from chronos.telemetry.metrics import FirerTelemetry
from chronos.ports import StoreHandle
from chronos.roles.firer.handoff import Shared
from chronos.runtime.backoff import POSTGRES_RETRY_CAP_S, Outage
from chronos.logs import Throttle
from chronos.runtime.process import Lifecycle

log = logging.getLogger("chronos.firer")

SLOW_STATEMENT = 1.0         # seconds: a claim or delete slower than this is logged (aggregated)


S = TypeVar("S", bound=StoreHandle)


class StoreThread(threading.Thread, Generic[S]):
    """A thread of the firer that talks to PostgreSQL, on a store of its own (a store is one
    connection, not thread-safe), which it closes when it ends; its port says which statements it may
    run. psycopg releases the GIL while it
    waits on the network, so no statement of these threads delays a publish that is due. The
    thread's name is the one its class goes by (`claimer`, `settler`)."""

    def __init__(self, name: str, store: S, settings: Settings, shared: Shared, telemetry: FirerTelemetry,
                 life: Lifecycle):
        super().__init__(name=name, daemon=True)
        self.store, self.settings, self.shared, self.metrics, self.life = store, settings, shared, telemetry, life
        self.throttle = Throttle(log)
        self.outage = Outage(log, cap=POSTGRES_RETRY_CAP_S)
        self.crashed: BaseException | None = None

    def run(self) -> None:
        try:
            self.loop()
        except ConfigError as exc:  # final (a pooler the settings did not expect): the process ends with it, one line
            self.crashed = exc
            self.life.stop()
        except BaseException as exc:  # noqa: BLE001 - the process stops as a whole when this thread dies
            log.exception("the %s failed; stopping the firer", self.name)
            self.crashed = exc
            self.life.stop()
        finally:
            self.store.close()

    def loop(self) -> None:
        raise NotImplementedError

    def measured(self, step: str, rows: int, started: float) -> None:
        """Record a statement's duration; one slow enough to hold up firing is also logged, since
        while a claim runs nothing more is claimed, and while a delete runs held rows age towards the
        hold time."""
        elapsed = time.perf_counter() - started
        self.metrics.batch(step, rows, elapsed)
        if elapsed > SLOW_STATEMENT:
            self.throttle.warning("slow " + step, "slow %s: %.1fs for %d rows (%d rows held by this firer)",
                                  step, elapsed, rows, self.shared.held())
