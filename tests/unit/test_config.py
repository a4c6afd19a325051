"""Settings: environment, flags, ready file, validation, redaction."""

from __future__ import annotations

import logging

import orjson
import pytest

from chronos import config
from chronos.commands._shared import serving_cell

from chronos import logs
from chronos.errors import ConfigError
from helpers import settings


def test_defaults_are_the_chronos_reference_values():
    s = settings()
    assert (s.input_topic, s.output_topic, s.dlq_topic) == ("chronos.input", "chronos.output", "chronos.dlq")
    assert (s.timing_advance_ms, s.hold_time_ms, s.poll_interval_ms, s.failure_detection_interval_ms) == \
        (50, 5000, 100, 500)
    assert s.max_lateness_ms is None
    assert s.max_publish_attempts == 10
    assert settings(argv=["--max-publish-attempts", "3"]).max_publish_attempts == 3


def test_flag_wins_over_environment():
    s = settings({"CHRONOS_HOLD_TIME_MS": "9000"}, ["--hold-time-ms", "7000"])
    assert s.hold_time_ms == 7000
    assert settings({"CHRONOS_HOLD_TIME_MS": "9000"}).hold_time_ms == 9000


def test_the_firer_s_byte_cap_takes_a_binary_unit_and_defaults_to_64_mib():
    assert settings({}).firer_max_held_bytes == 64 << 20
    assert [settings({"CHRONOS_FIRER_MAX_HELD_BYTES": raw}).firer_max_held_bytes
            for raw in ("2097152", "1024k", "16M", "16MiB", "1g")] == [2 << 20, 1 << 20, 16 << 20, 16 << 20, 1 << 30]


def test_a_firer_has_two_claimers_unless_told_otherwise():
    assert settings({}).firer_claimers == 1
    assert settings({"CHRONOS_FIRER_CLAIMERS": "16"}).firer_claimers == 16


def test_a_firer_deletes_what_it_claims_unless_told_to_stamp_it():
    assert settings({}).firer_claim == "delete"
    assert settings({"CHRONOS_FIRER_CLAIM": "Stamp"}).firer_claim == "stamp"


@pytest.mark.parametrize("env,message", [
    ({"CHRONOS_FIRER_CLAIM": "lease"}, "CHRONOS_FIRER_CLAIM must be one of delete, stamp, got 'lease'"),
    ({"CHRONOS_HOLD_TIME_MS": "abc"}, "CHRONOS_HOLD_TIME_MS must be a whole number"),
    ({"CHRONOS_HOLD_TIME_MS": "0"}, "greater than 0"),
    ({"CHRONOS_TIMING_ADVANCE_MS": "-1"}, "0 or more"),
    ({"CHRONOS_OUTPUT_TOPIC": "bad topic!"}, "not a valid Kafka topic"),
    ({"CHRONOS_DATABASE_URL": "mysql://x"}, "postgresql://"),
    ({"CHRONOS_LOG_FORMAT": "xml"}, "one of text, json"),
    ({"CHRONOS_METRICS_PORT": "70000"}, "TCP port"),
    ({"CHRONOS_KAFKA_PROPERTIES": "novalue"}, "key=value"),
    ({"CHRONOS_ALLOWED_TOPICS": "(unclosed"}, "regular expression"),
    ({"CHRONOS_LOOKAHEAD_MS": "3000"}, "less than half"),
    ({"CHRONOS_MAX_PUBLISH_ATTEMPTS": "0"}, "CHRONOS_MAX_PUBLISH_ATTEMPTS must be greater than 0"),
    ({"CHRONOS_MAX_PUBLISH_ATTEMPTS": "many"}, "CHRONOS_MAX_PUBLISH_ATTEMPTS must be a whole number"),
    ({"CHRONOS_KAFKA_PROPERTIES_FILE": "/nonexistent/x.properties"}, "cannot read"),
    ({"CHRONOS_FIRE_RATE_LIMITS": "orders"}, "CHRONOS_FIRE_RATE_LIMITS must be a list of TOPIC=RATE pairs"),
    ({"CHRONOS_FIRE_RATE_LIMITS": "orders=fast"}, "'fast' is not a rate"),
    ({"CHRONOS_FIRE_RATE_LIMITS": "orders=-5"}, "is not a rate"),
    ({"CHRONOS_FIRE_RATE_LIMITS": "orders=0"}, "a rate must be more than 0"),
    ({"CHRONOS_FIRE_RATE_LIMITS": "orders=5/day"}, "is not a rate"),
    ({"CHRONOS_FIRE_RATE_LIMITS": "bad topic=5"}, "not a topic name or pattern"),
    ({"CHRONOS_FIRE_RATE_LIMITS": "=5"}, "not a topic name or pattern"),
    ({"CHRONOS_FIRE_RATE_LIMITS": "a=1,a=2"}, "'a' is given twice"),
    ({"CHRONOS_FIRE_RATE_DEFAULT": "lots"}, "CHRONOS_FIRE_RATE_DEFAULT: 'lots' is not a rate"),
    ({"CHRONOS_FIRE_RATE_DEFAULT": "0/s"}, "more than 0"),
    ({"CHRONOS_FIRER_MAX_HELD_BYTES": "lots"}, "CHRONOS_FIRER_MAX_HELD_BYTES must be a size in bytes"),
    ({"CHRONOS_FIRER_MAX_HELD_BYTES": "64T"}, "with a unit \\(512k, 64M, 1G\\)"),
    ({"CHRONOS_FIRER_MAX_HELD_BYTES": "1000"}, "must be at least 1M"),
    ({"CHRONOS_FIRER_CLAIMERS": "0"}, "CHRONOS_FIRER_CLAIMERS must be greater than 0"),
    ({"CHRONOS_FIRER_CLAIMERS": "17"}, "CHRONOS_FIRER_CLAIMERS must be at most 16 \\(a claimer claims at least one"),
    ({"CHRONOS_FIRER_CLAIMERS": "two"}, "CHRONOS_FIRER_CLAIMERS must be a whole number"),
    ({"CHRONOS_METRICS_ADDRESS": "10.0.0.11:9400"}, "CHRONOS_METRICS_ADDRESS must be an IP address or a host name, "
                                                    "without a port"),
    ({"CHRONOS_METRICS_ADDRESS": ""}, "CHRONOS_METRICS_ADDRESS must be an IP address"),
    ({"CHRONOS_METRICS_WEB_CONFIG_FILE": "/nonexistent/web.yml"}, "CHRONOS_METRICS_WEB_CONFIG_FILE: cannot read"),
    ({"CHRONOS_METRICS_SCRAPE_CONFIG_FILE": "/nonexistent/s.yml"}, "CHRONOS_METRICS_SCRAPE_CONFIG_FILE: cannot read"),
])
def test_bad_values_give_a_clear_one_line_error(env, message):
    with pytest.raises(ConfigError, match=message) as err:
        settings(env)
    assert "\n" not in str(err.value)


def test_kafka_properties_from_file_and_inline(tmp_path):
    f = tmp_path / "kafka.properties"
    f.write_text("# TLS\nsecurity.protocol=SASL_SSL\nsasl.password=s3cret=x\nssl.ca.location=/ca.pem\n")
    s = settings({"CHRONOS_KAFKA_PROPERTIES_FILE": str(f), "CHRONOS_KAFKA_PROPERTIES": "ssl.ca.location=/other.pem"})
    assert s.kafka_config == {"security.protocol": "SASL_SSL", "sasl.password": "s3cret=x",
                              "ssl.ca.location": "/other.pem"}
    assert "s3cret=x" in s.secrets()


def test_ready_file_fills_in_services(tmp_path):
    ready = tmp_path / "ready.json"
    ready.write_bytes(orjson.dumps({"bootstrap_servers": "127.0.0.1:1", "database_url": "postgresql://h/db",
                                    "input_topic": "in", "output_topic": "out", "dlq_topic": "dlq"}))
    s = settings(argv=["--ready-file", str(ready)])
    assert (s.kafka_bootstrap_servers, s.database_url, s.input_topic) == ("127.0.0.1:1", "postgresql://h/db", "in")
    with pytest.raises(ConfigError, match="does not exist"):
        settings(argv=["--ready-file", str(tmp_path / "missing.json")])


def test_missing_services_are_named():
    with pytest.raises(ConfigError, match="CHRONOS_DATABASE_URL is not set"):
        settings().require_services()


def test_redact_url_hides_the_password():
    assert config.redact_url("postgresql://app:p%40ss@db:5432/x?sslmode=require") == \
        "postgresql://app:***@db:5432/x?sslmode=require"
    assert config.redact_url("postgresql://db/x") == "postgresql://db/x"


def test_log_filter_redacts_secrets(capsys):
    logs.setup("test", "0" * 32, "info", "text", ["hunter2"])
    logging.getLogger("chronos.x").warning("cannot connect to postgresql://u:hunter2@h/db: %s", "hunter2 bad")
    err = capsys.readouterr().err
    assert "hunter2" not in err and "***" in err


def test_json_logs_parse(capsys):
    logs.setup("firer", "abcd" * 8, "info", "json", [])
    logging.getLogger("chronos.firer").info("fired %d", 5)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    entry = orjson.loads(line)
    assert entry["role"] == "firer" and entry["node"] == "abcd" * 8 and entry["msg"] == "fired 5"
    assert entry["level"] == "info"


# -- cells ---------------------------------------------------------------------------------------

CELLS = "a=postgresql://app:s3cret@db-a1:5432,db-a2:5432/chronos?sslmode=require b=postgresql://app:other@db-b/chronos"


def test_cells_are_name_url_pairs_in_order_multi_host_urls_included():
    s = settings({"CHRONOS_CELLS": CELLS})
    assert s.cells == (("a", "postgresql://app:s3cret@db-a1:5432,db-a2:5432/chronos?sslmode=require"),
                       ("b", "postgresql://app:other@db-b/chronos"))
    assert s.databases() == dict(s.cells)
    # commas between pairs work too (a ready file's cells come so), one inside a URL is the URL's
    assert settings({"CHRONOS_CELLS": CELLS.replace(" ", ",")}).cells == s.cells
    assert settings(argv=["--cells", CELLS]).cells == s.cells
    # without cells, the one database is the only cell
    assert settings({"CHRONOS_DATABASE_URL": "postgresql://h/db"}).databases() == {"": "postgresql://h/db"}


@pytest.mark.parametrize("raw,message", [
    ("a=postgresql://h/x a=postgresql://h/y", "names cell 'a' twice"),
    ("postgresql://h/x", "NAME=URL pairs"),
    ("a b=postgresql://h/y", "NAME=URL pairs"),
    ("a=mysql://u:hidden@h/x", "CHRONOS_CELLS \\(cell a\\) must be a postgresql:// URL, got 'mysql://u:\\*\\*\\*@h/x'"),
    ("bad/name=postgresql://h/x", "NAME=URL pairs"),
])
def test_a_list_of_cells_that_is_not_one_is_refused_without_its_passwords(raw, message):
    with pytest.raises(ConfigError, match=message) as refused:
        settings({"CHRONOS_CELLS": raw})
    assert "hidden" not in str(refused.value)


def test_the_cells_passwords_are_secrets_and_the_cell_must_be_listed():
    s = settings({"CHRONOS_CELLS": CELLS})
    assert {"s3cret", "other"} <= set(s.secrets())
    with pytest.raises(ConfigError, match="CHRONOS_CELL names cell 'c', which CHRONOS_CELLS does not list \\(a, b\\)"):
        settings({"CHRONOS_CELLS": CELLS, "CHRONOS_CELL": "c"})


def test_the_cells_go_to_the_programs_and_come_back_from_a_ready_file(tmp_path):
    s = settings({"CHRONOS_CELLS": CELLS})
    assert settings(config.to_environ(s)).cells == s.cells
    ready = tmp_path / "ready.json"
    ready.write_bytes(orjson.dumps({"bootstrap_servers": "127.0.0.1:1", "database_url": None,
                                    "cells": dict(s.cells)}))
    assert settings(argv=["--ready-file", str(ready)]).cells == s.cells


def test_a_firer_or_detector_serves_its_cell_or_the_cells_in_turn_by_process_number():
    s = settings({"CHRONOS_CELLS": CELLS})
    by_num = [serving_cell(s, {"CHRONOS_PROCESS_NUM": str(n)}) for n in range(4)]
    assert [(x.cell, x.database_url) for x in by_num] == [("a", s.cells[0][1]), ("b", s.cells[1][1])] * 2
    named = serving_cell(settings({"CHRONOS_CELLS": CELLS, "CHRONOS_CELL": "b"}), {"CHRONOS_PROCESS_NUM": "0"})
    assert (named.cell, named.database_url) == ("b", s.cells[1][1])
    assert serving_cell(s, {}).cell == "a"
    without = settings({"CHRONOS_DATABASE_URL": "postgresql://h/db"})
    assert serving_cell(without, {"CHRONOS_PROCESS_NUM": "3"}) is without
