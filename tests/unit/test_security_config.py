"""TLS and SASL settings reach librdkafka and PostgreSQL unchanged; secrets stay out of what is shown."""

from __future__ import annotations

import argparse
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from chronos import cli, config
from chronos.adapters.kafka.clients import consumer_config, describe, producer_config
from chronos.up.stack import Options, Stack

SASL_SSL = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "chronos-app",
    "ssl.ca.location": "/etc/chronos/ca.pem",
    "ssl.certificate.location": "/etc/chronos/client.pem",
    "ssl.key.location": "/etc/chronos/client.key",
    "ssl.endpoint.identification.algorithm": "https",
}
# a file may hold what the inline list cannot: values with commas, equals signs, spaces
FILE_SECRETS = {"sasl.password": "p@ss=w,rd with spaces", "ssl.key.password": "k3y,pa=ss"}
DB_URL = ("postgresql://chronos:db%20secret@db.internal:5433/chronos?sslmode=verify-full"
          "&sslrootcert=/etc/chronos/root.crt&sslcert=/etc/chronos/pg.crt&sslkey=/etc/chronos/pg.key"
          "&target_session_attrs=read-write&connect_timeout=7")


def _settings(tmp_path: Path, **env: str) -> config.Settings:
    props = tmp_path / "kafka.properties"
    props.write_text("# secrets live here\n" + "".join(f"{k}={v}\n" for k, v in FILE_SECRETS.items()))
    environ = {
        "CHRONOS_DATABASE_URL": DB_URL,
        "CHRONOS_KAFKA_BOOTSTRAP_SERVERS": "kafka-1:9093,kafka-2:9093",
        "CHRONOS_KAFKA_PROPERTIES": ",".join(f"{k}={v}" for k, v in SASL_SSL.items()),
        "CHRONOS_KAFKA_PROPERTIES_FILE": str(props),
        **env,
    }
    return config.load(None, environ=environ, default_ready_file=False)


def test_tls_and_sasl_settings_reach_both_kafka_clients_unchanged(tmp_path):
    s = _settings(tmp_path)
    for conf in (producer_config(s), consumer_config(s)):
        assert conf["bootstrap.servers"] == "kafka-1:9093,kafka-2:9093"
        for key, value in {**SASL_SSL, **FILE_SECRETS}.items():
            assert conf[key] == value, key


def test_the_users_word_wins_over_chronos_defaults(tmp_path):
    s = _settings(tmp_path, CHRONOS_KAFKA_PROPERTIES="acks=1,enable.idempotence=false,auto.offset.reset=latest")
    assert producer_config(s)["acks"] == "1" and producer_config(s)["enable.idempotence"] == "false"
    assert consumer_config(s)["auto.offset.reset"] == "latest"


def test_describe_hides_kafka_secrets(tmp_path):
    s = _settings(tmp_path)
    shown = describe(producer_config(s))
    for secret in FILE_SECRETS.values():
        assert secret not in shown
    assert "sasl.password=***" in shown and "sasl.username=chronos-app" in shown
    assert set(FILE_SECRETS.values()) <= set(s.secrets())


def test_database_tls_settings_reach_libpq_unchanged(tmp_path):
    s = _settings(tmp_path)
    assert s.database_url == DB_URL
    params = conninfo_to_dict(s.database_url)
    assert params["sslmode"] == "verify-full"
    assert params["sslrootcert"] == "/etc/chronos/root.crt"
    assert (params["sslcert"], params["sslkey"]) == ("/etc/chronos/pg.crt", "/etc/chronos/pg.key")
    assert params["target_session_attrs"] == "read-write" and params["connect_timeout"] == "7"
    assert params["password"] == "db secret"
    assert "db%20secret" in s.database_url and "db secret" in s.secrets()
    assert config.redact_url(DB_URL) == DB_URL.replace("chronos:db%20secret@", "chronos:***@")


def test_settings_reach_the_programs_of_chronos_up_unchanged(tmp_path):
    """`chronos up` hands its settings to supervisord's programs through the environment."""
    props = tmp_path / "kafka.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in FILE_SECRETS.items()))
    args = cli.build_parser().parse_args([
        "up", "--database-url", DB_URL, "--kafka-bootstrap-servers", "kafka-1:9093",
        "--kafka-properties", ",".join(f"{k}={v}" for k, v in SASL_SSL.items()),
        "--kafka-properties-file", str(props)])
    args.ready_file = None
    s = config.load(args, environ={}, default_ready_file=False)
    stack = Stack(Options(s, tmp_path / "data", {"consumer": 1, "firer": 1, "detector": 1},
                          kafka_properties_file=str(props)))
    env = stack.environ()
    child = config.load(argparse.Namespace(), environ={k: v for k, v in env.items() if k.startswith("CHRONOS_")},
                        default_ready_file=False)
    assert child.database_url == DB_URL
    assert child.kafka_config == {**FILE_SECRETS, **SASL_SSL}
    # secrets from the file reach the programs through the file, not their environment
    assert not any(secret in value for secret in FILE_SECRETS.values() for value in env.values())
