"""What a firer process holds of PostgreSQL, as the server counts it (pg_stat_activity, by the process's
`application_name`): one session for its settler and one per claimer, and with the claim that deletes one
per batch in flight (one while nothing is due), as Capacity planning says."""

from __future__ import annotations

import re

import psycopg
import pytest

from helpers import wait_for


@pytest.mark.parametrize(("settings", "sessions"), [
    ({"CHRONOS_FIRER_CLAIMERS": "3", "CHRONOS_FIRER_CLAIM": "stamp"}, 4),
    ({"CHRONOS_FIRER_CLAIMERS": "3", "CHRONOS_FIRE_RATE_LIMITS": "elsewhere=100", "CHRONOS_FIRER_CLAIM": "stamp"},
     2),  # one claimer under limits
    ({}, 3),  # the default: claims that delete, and the session they hold their batches on, none in flight
], ids=["three claimers", "fire-rate limits", "claims that delete"])
def test_a_firer_holds_a_session_for_its_settler_and_one_per_claimer(processes, database_url, settings, sessions):
    proc = processes.start("firer", **settings)
    log = processes.wait_for_log(proc, "claimers")  # its threads made, about to start them
    found = re.search(r"starting: node ([0-9a-f-]{36})", log)
    assert found, log

    def held() -> int:
        with psycopg.connect(database_url, autocommit=True) as conn:
            (count,) = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                    (f"chronos firer {found[1]}",)).fetchone()
        return count

    wait_for(lambda: held() == sessions, 20, f"the firer's {sessions} sessions")
