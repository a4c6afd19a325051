"""`chronos targets`: a host's file-based discovery groups from its process counts and metrics port
(chronos.ops.targets)."""

from __future__ import annotations

import argparse

import pytest
import yaml

from chronos.errors import ConfigError
from chronos.ops.targets import counts_of, groups, render
from chronos.telemetry.endpoints import metrics_port


def test_each_program_the_host_runs_is_a_target_and_a_role_it_runs_none_of_has_no_group():
    found = groups("10.0.0.12", 9400, {"consumer": 2, "firer": 1, "detector": 0})
    assert found == [{"targets": ["10.0.0.12:9400", "10.0.0.12:9401"], "labels": {"host": "10.0.0.12", "program": "consumer"}},
                     {"targets": ["10.0.0.12:9500"], "labels": {"host": "10.0.0.12", "program": "firer"}}]


def test_the_targets_are_the_ports_the_programs_listen_on_under_supervisord():
    counts = {"consumer": 3, "firer": 2, "detector": 1}
    listed = {t for g in groups("h", 9400, counts) for t in g["targets"]}
    served = {f"h:{metrics_port(role, 9400, {'CHRONOS_PROCESS_NUM': str(n)})}" for role, count in counts.items()
              for n in range(count)}
    assert listed == served


def test_the_file_is_yaml_prometheus_reads_with_an_ipv6_address_in_brackets_and_a_host_label():
    found = groups("fd00::12", 9400, {"consumer": 1, "firer": 0, "detector": 1}, host="chronos-3")
    text = render(found, "Host chronos-3")
    assert text.startswith("# Host chronos-3\n")
    assert yaml.safe_load(text) == [
        {"targets": ["[fd00::12]:9400"], "labels": {"host": "chronos-3", "program": "consumer"}},
        {"targets": ["[fd00::12]:9600"], "labels": {"host": "chronos-3", "program": "detector"}}]
    assert yaml.safe_load(render([], "Host empty")) == []


def args(**given) -> argparse.Namespace:
    return argparse.Namespace(**{f"{role}s": given.get(role) for role in ("consumer", "firer", "detector")})


def test_the_counts_come_from_supervisords_variables_unless_a_flag_gives_one():
    environ = {"CHRONOS_CONSUMERS": "2", "CHRONOS_FIRERS": "2", "CHRONOS_DETECTORS": "1"}
    assert counts_of(args(), environ) == {"consumer": 2, "firer": 2, "detector": 1}
    assert counts_of(args(detector=0), environ) == {"consumer": 2, "firer": 2, "detector": 0}


@pytest.mark.parametrize("environ, says", [
    ({"CHRONOS_CONSUMERS": "2", "CHRONOS_FIRERS": "2"}, "CHRONOS_DETECTORS is not set: give the host's environment file"),
    ({"CHRONOS_CONSUMERS": "two", "CHRONOS_FIRERS": "2", "CHRONOS_DETECTORS": "1"}, "CHRONOS_CONSUMERS must be a whole number"),
    ({"CHRONOS_CONSUMERS": "-1", "CHRONOS_FIRERS": "2", "CHRONOS_DETECTORS": "1"}, "CHRONOS_CONSUMERS must be 0 or more"),
])
def test_counts_missing_or_wrong_are_a_configuration_error(environ, says):
    with pytest.raises(ConfigError, match=says):
        counts_of(args(), environ)
