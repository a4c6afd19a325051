"""What the replicated PostgreSQL kit decides before any process runs: Patroni's configuration, the
URL, the limits it refuses, where it finds Patroni."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from chronos.embedded.patroni import PATRONI_ENV, ReplicatedPostgres, patroni_command, patroni_config
from chronos.embedded.procs import EmbeddedError
from chronos.errors import ConfigError

PASSWORDS = {"superuser": "s", "replication": "r", "app": "a"}


def _config(**overrides):
    args = dict(name="pg0", pg_port=5432, restapi_port=8008, etcd_port=2379, node_dir=Path("/w/pg0"),
                bin_dir=Path("/pg/bin"), passwords=PASSWORDS, ttl=20, loop_wait=1, retry_timeout=4,
                strict=False, fast=False)
    return patroni_config(**{**args, **overrides})


def test_commits_wait_for_the_synchronous_standby_even_when_fast():
    config = _config(fast=True)
    dcs = config["bootstrap"]["dcs"]
    assert dcs["synchronous_mode"] is True and dcs["synchronous_mode_strict"] is False
    assert (dcs["ttl"], dcs["loop_wait"], dcs["retry_timeout"]) == (20, 1, 4)
    local = config["postgresql"]["parameters"]
    assert local["fsync"] == "off"
    # what a synchronous commit and pg_rewind need is never turned off
    assert "synchronous_commit" not in local and "full_page_writes" not in local
    assert dcs["postgresql"]["parameters"]["wal_log_hints"] == "on"
    assert dcs["postgresql"]["use_pg_rewind"] and config["postgresql"]["use_pg_rewind"]
    assert "fsync" not in _config()["postgresql"]["parameters"]


def test_everything_listens_on_loopback_with_passwords():
    config = _config(strict=True)
    assert config["bootstrap"]["dcs"]["synchronous_mode_strict"] is True
    assert config["postgresql"]["listen"] == "127.0.0.1:5432"
    assert config["postgresql"]["parameters"]["listen_addresses"] == "127.0.0.1"
    assert config["restapi"]["listen"] == "127.0.0.1:8008"
    assert all(rule.startswith("host ") and rule.endswith("127.0.0.1/32 scram-sha-256")
               for rule in config["postgresql"]["pg_hba"])


def test_the_url_names_every_member_and_asks_for_the_writable_one(tmp_path: Path):
    kit = ReplicatedPostgres(tmp_path, members=3, base_port=15400)
    url = kit.url
    assert url.startswith("postgresql://chronos:")
    assert url.endswith("@127.0.0.1:15400,127.0.0.1:15401,127.0.0.1:15402/chronos"
                        "?target_session_attrs=read-write&connect_timeout=2")
    assert [(m.name, m.pg_port, m.restapi_port) for m in kit.members] == [
        ("pg0", 15400, 15410), ("pg1", 15401, 15411), ("pg2", 15402, 15412)]
    assert kit.etcd_url == "http://127.0.0.1:15420"


@pytest.mark.parametrize("kwargs, says", [
    ({"members": 1}, "2 to 5 members"),
    ({"members": 6}, "2 to 5 members"),
    ({"ttl": 10}, "minimum of 20"),
    ({"ttl": 20, "retry_timeout": 10}, "loop_wait + 2 * retry_timeout <= ttl"),
])
def test_it_refuses_what_patroni_would_not_do(tmp_path: Path, kwargs, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        ReplicatedPostgres(tmp_path, **kwargs)


def test_patroni_is_found_through_the_environment(tmp_path: Path, monkeypatch):
    program = tmp_path / "venv" / "bin" / "patroni"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    os.chmod(program, 0o755)
    monkeypatch.setenv(PATRONI_ENV, str(tmp_path / "venv"))
    assert patroni_command() == program
    monkeypatch.setenv(PATRONI_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(EmbeddedError, match="neither the patroni program"):
        patroni_command()
