"""A rolling upgrade and a rollback under load on the fleet, with the upgrade page's blocks as written
(docs/operations/upgrading.md): both hosts on the previous release, built from its commit as the
changelog records it; one host upgraded (this release on the previous one's schema), an old firer of the
other killed (supervisord starts it again, on the old release), the other host upgraded, the first rolled
back and upgraded again; then `chronos migrate` with this release, under its running processes. Nothing is
lost or published early, and deliveries never pause for a second."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from kits.fleet import Fleet, install_chronos, previous_release, release_wheel
from kits.fleet.install import release_schema_version
from kits.fleet.scenarios import rolling_upgrade
from chronos import __version__
from chronos.adapters.postgres.migrations import migrations

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(900)]

PREVIOUS = previous_release()
RATE = 300
PAUSE_S = 1.0  # the longest pause in deliveries the upgrade may cause


@pytest.fixture(scope="module")
def fleet_on_previous(opt_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A fleet whose hosts run the previous release (its environment installed beside this one's)."""
    work = tmp_path_factory.mktemp("previous-release")
    install_chronos(release_wheel(PREVIOUS, work), opt_dir, work)
    with Fleet(tmp_path_factory.mktemp("fleet-upgrade"), opt_dir, release=PREVIOUS).serving() as fleet:
        yield fleet


def test_a_rolling_upgrade_and_a_rollback_under_load_lose_nothing_and_pause_nothing(fleet_on_previous, fault_report):
    fleet = fleet_on_previous
    report, row = rolling_upgrade(fleet, rate=RATE, warmup=3.0, settle=3.0)
    fault_report(report)
    print(row["steps"])
    assert report.lost == [], report.line()
    assert report.early == [], report.line()
    assert report.unexplained == [], (report.line(), report.unexplained[:5])
    assert row["longest_pause_s"] is not None and row["longest_pause_s"] < PAUSE_S, row

    everyone = {h.name: {p: PREVIOUS for p in h.programs()} for h in fleet.chronos}
    assert row["running_before"] == everyone, row["running_before"]
    first, kill, second, back, again, migrate = (s["running"] for s in row["steps"])
    # two releases side by side, on the previous release's schema
    assert set(first["chronos-1"].values()) == {__version__} and set(first["chronos-2"].values()) == {PREVIOUS}, first
    assert kill == first, kill  # the killed old firer is back, on the old release
    assert set(second["chronos-2"].values()) == {__version__} and set(second["chronos-1"].values()) == {__version__}
    assert set(back["chronos-1"].values()) == {PREVIOUS} and set(back["chronos-2"].values()) == {__version__}, back
    assert row["steps"][3]["output"].strip().endswith(f"chronos {PREVIOUS}"), row["steps"][3]
    everyone_new = {h.name: {p: __version__ for p in h.programs()} for h in fleet.chronos}
    assert again == everyone_new and migrate == everyone_new, (again, migrate)
    # the migration ran under the running processes, which carried on on the new schema
    old_schema = release_schema_version(PREVIOUS)
    newer = [m.version for m in migrations() if m.version > old_schema]
    said = f"applied migrations {', '.join(map(str, newer))};" if newer else f"schema already at version {old_schema}"
    assert said in row["steps"][5]["output"], (said, row["steps"][5])
    # each program started once per restart of its host, the killed firer once more: no other crash
    planned = {f"{h.name}/{p}": 3 if h.name == "chronos-1" else 1 for h in fleet.chronos for p in h.programs()}
    planned["chronos-2/firer_00"] += 1
    assert row["started_again"] == planned, row["started_again"]
