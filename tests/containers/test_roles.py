"""The image's consumer, firer and detector, each a container, against the tests' PostgreSQL and broker, under a
steady load: their health endpoints answer probes; SIGTERM stops each within the grace period its Kubernetes
manifest gives it, and a container killed outright loses nothing; everything sent is delivered, none early."""

from __future__ import annotations

import re
import urllib.request

import orjson
import pytest

from kits.traffic import Load, Reader, held_rows, still_stored
from kits.verdicts import TIMING_ADVANCE_S
from containerkit import ROLES, grace_s
from helpers import wait_for

pytestmark = pytest.mark.timeout(600)
NODE = re.compile(r"starting: node ([0-9a-f-]{36})")


def probe(port: int, path: str) -> tuple[int, dict]:
    """A probe's HTTP GET: (status, the JSON report), (0, {}) when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, orjson.loads(answer.read())
    except urllib.error.HTTPError as failed:
        return failed.code, orjson.loads(failed.read())
    except OSError:  # refused: not listening yet
        return 0, {}


@pytest.fixture
def load(broker, topics):
    """A steady load on the input topic (200 msg/s, delays of 0.5-3 s, a tenth already late) and a reader of the
    output topic; both stopped at the end."""
    reader = Reader(broker.bootstrap_servers, topics["output"])
    reader.start()
    reader.wait_assigned()
    sending = Load(broker.bootstrap_servers, topics["input"], rate=200, delays=(0.5, 3.0))
    sending.start()
    yield sending, reader
    sending.stop()
    reader.stop()


def all_delivered(load: Load, reader: Reader, env: dict[str, str], timeout: float = 90.0) -> None:
    """Stop the load; everything the broker acknowledged is on the output topic, and nothing arrives before its
    deadline."""
    load.stop()
    missing = reader.missing(set(load.sent), timeout=timeout)
    # the message, with its look-up in the store, is made only when the assertion fails
    assert not missing, (f"{len(missing)} of {len(load.sent)} lost, "
                         f"{len(still_stored(env['CHRONOS_DATABASE_URL'], missing))} of them still stored; e.g. (id, input "
                         f"partition, offset): {[(m, load.sent[m].partition, load.sent[m].offset) for m in sorted(missing)[:5]]}")
    early = [m for m, s in load.sent.items()
             if m in reader.arrivals and min(reader.arrivals[m]) < s.deadline - TIMING_ADVANCE_S]
    assert not early, early[:5]


def test_each_role_answers_probes_and_stops_on_sigterm_within_its_grace_period_losing_nothing(containers, load):
    sending, reader = load
    started = {role: containers.role(role) for role in ROLES}
    for role, (container, port) in started.items():
        status, report = wait_for(lambda: (lambda r: r if r[0] == 200 else None)(probe(port, "/healthz")),
                                  what=f"the {role}'s /healthz")
        assert report["role"] == role
        assert probe(port, "/livez")[0] == 200
        # an exec probe, as a container's HEALTHCHECK would run it
        inside = container.exec("chronos", "health", "--metrics-port", str(port))
        assert inside.returncode == 0 and orjson.loads(inside.stdout)["status"] == "ok", inside.stdout + inside.stderr
    wait_for(lambda: reader.arrivals, timeout=30, what="the first deliveries")
    for role, (container, _) in started.items():
        if role == "firer":
            wait_for(lambda: held_rows(containers.env["CHRONOS_DATABASE_URL"]), timeout=30, what="rows claimed")
        took = container.stop(grace_s(role))
        logs = container.logs()
        # 0: it ended by itself; a container SIGKILLed at the end of its grace period ends with 137
        assert container.exit_code == 0, logs[-3000:]
        assert took < grace_s(role) and re.search(rf"{role} stopped after \d+s", logs), logs[-3000:]
    for role in ROLES:  # as Kubernetes starts the pods again
        containers.role(role)
    all_delivered(sending, reader, containers.env)


def test_containers_killed_under_load_lose_nothing(containers, load):
    sending, reader = load
    started = {role: containers.role(role)[0] for role in ROLES}
    (node,) = NODE.findall(started["firer"].logs())
    url = containers.env["CHRONOS_DATABASE_URL"]
    held = wait_for(lambda: held_rows(url, node), timeout=30, what="rows held by the firer")
    started["firer"].kill()
    started["consumer"].kill()
    assert started["firer"].exit_code == 137
    # its claims delete (the default): PostgreSQL ends the transactions that held its batches as their connections
    # close, and the rows are back for the firer started again, long before the hold time
    wait_for(lambda: not held_rows(url, node), timeout=4, what="the killed firer's rows back")
    for role in ("consumer", "firer"):
        containers.role(role)
    all_delivered(sending, reader, containers.env)
    assert held.keys() <= reader.arrivals.keys()
