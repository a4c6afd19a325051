"""Chronos and Kafka over TLS, from the documented settings (CHRONOS_KAFKA_PROPERTIES_FILE): the three
processes, `chronos send` and `tail`, and `chronos up` against external services (PostgreSQL over TLS
too, with `status` and the console); a certificate no trusted authority signed, one for another host, or
a refused SASL login is one line and a final exit; a rotated server certificate is picked up without a
restart.

The broker is the embedded one behind stunnel (kits/tls.py says why), advertising the proxy's
address, so every connection the clients make, the first and the ones metadata points them to, is TLS.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest
from helpers import EMBEDDED_KAFKA, wait_for
from kits.tls import APP_PASSWORD, Authority, TlsProxy, app_url

from kits.fleet import ROOT, page_blocks
from chronos.adapters.kafka.admin import create_topics
from chronos.embedded.broker import BROKER_STORAGE, EmbeddedBroker, broker_bin
from chronos.embedded.procs import free_port, tcp_accepts
from chronos.errors import EXIT_CONFIG

CHRONOS = [sys.executable, "-m", "chronos"]
ROLES = ("consumer", "firer", "detector")
# in the properties file with the TLS settings, as production keeps it: it must never show
KAFKA_SECRET = "Kafka-S3cret-pw"


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("CHRONOS_", "PG"))}, **extra}


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory, authority: Authority):
    """(broker, proxy): the embedded broker reachable only through stunnel's TLS, with a certificate for
    127.0.0.1 from `authority`."""
    base = tmp_path_factory.mktemp("tls-broker")
    broker = EmbeddedBroker(log_path=base / "broker.log")
    proxy = TlsProxy(base, broker.port, *authority.issue("kafka"))
    broker.advertised = proxy.address
    proxy.start()
    broker.start()
    yield broker, proxy
    broker.stop()
    proxy.stop()


def _properties(path: Path, ca_file: Path, **extra: str) -> Path:
    """A librdkafka properties file for TLS that checks the broker's certificate and name, as
    production writes it."""
    props = {"security.protocol": "SSL", "ssl.ca.location": str(ca_file),
             "ssl.endpoint.identification.algorithm": "https",
             # read by SASL only (this broker has none), present like in a real file of secrets
             "sasl.username": "chronos", "sasl.password": KAFKA_SECRET, **EMBEDDED_KAFKA, **extra}
    path.write_text("# Kafka over TLS\n" + "".join(f"{k}={v}\n" for k, v in props.items()))
    path.chmod(0o600)
    return path


@pytest.fixture
def tls_env(tls_broker, authority, database_url, tmp_path) -> dict[str, str]:
    """Environment for chronos against the TLS broker (fresh topics) and this test's database."""
    broker, proxy = tls_broker
    suffix = uuid.uuid4().hex[:8]
    topics = {"input": f"in-{suffix}", "output": f"out-{suffix}", "dlq": f"dlq-{suffix}"}
    props = _properties(tmp_path / "kafka.properties", authority.ca_file)
    # created through the proxy with the same settings: nothing reaches the broker in plaintext
    create_topics(proxy.address, {t: 4 for t in topics.values()},
                  client_config={"security.protocol": "SSL", "ssl.ca.location": str(authority.ca_file)})
    return {"CHRONOS_DATABASE_URL": database_url, "CHRONOS_KAFKA_BOOTSTRAP_SERVERS": proxy.address,
            "CHRONOS_KAFKA_PROPERTIES_FILE": str(props), "CHRONOS_INPUT_TOPIC": topics["input"],
            "CHRONOS_OUTPUT_TOPIC": topics["output"], "CHRONOS_DLQ_TOPIC": topics["dlq"],
            "CHRONOS_CONSUMER_GROUP": f"chronos-{suffix}", "CHRONOS_HOLD_TIME_MS": "3000"}


def _send_and_tail(env: dict[str, str], value: str, nth: int = 1) -> str:
    """`chronos send` one message due in a second, the `nth` on the output topic, then `chronos tail` the
    topic until it arrives: tail's output."""
    sent = subprocess.run(CHRONOS + ["send", "--delay", "1s", "--value", value], env=env,
                          capture_output=True, text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    tail = subprocess.run(CHRONOS + ["tail", "--from-beginning", "--count", str(nth), "--timeout", "45"], env=env,
                          capture_output=True, text=True, timeout=90)
    assert tail.returncode == 0, tail.stderr
    assert f"value={value!r}" in tail.stdout, tail.stdout + tail.stderr
    for out in (sent, tail):
        assert KAFKA_SECRET not in out.stdout + out.stderr
    return tail.stdout


def test_the_processes_send_and_tail_work_over_tls(processes, tls_env, tls_broker):
    procs = [processes.start(role, **tls_env, CHRONOS_LOG_LEVEL="debug") for role in ROLES]
    for proc in procs:
        processes.wait_for_log(proc, "starting: node")
    _send_and_tail(_env(**tls_env), "over-tls")
    for proc in procs:
        assert proc.poll() is None, processes.log_of(proc)
        assert KAFKA_SECRET not in processes.log_of(proc)


def test_an_untrusted_certificate_is_one_line_and_final_for_every_command(processes, tls_env, tmp_path, authority):
    """A certificate of an authority the client does not trust, and a certificate for another host name:
    `send` and `tail` say so in one line, the consumer and the firer log it once and exit 2 (supervisord
    does not restart them); none waits for a timeout or retries forever."""
    other = Authority("other", tmp_path / "other")
    cases = {"another authority": (_properties(tmp_path / "other.properties", other.ca_file), tls_env[
                 "CHRONOS_KAFKA_BOOTSTRAP_SERVERS"]),
             "another host name": (Path(tls_env["CHRONOS_KAFKA_PROPERTIES_FILE"]),
                                   tls_env["CHRONOS_KAFKA_BOOTSTRAP_SERVERS"].replace("127.0.0.1", "localhost"))}
    started = time.monotonic()
    runs = {}
    for name, (props, bootstrap) in cases.items():
        env = {**tls_env, "CHRONOS_KAFKA_PROPERTIES_FILE": str(props), "CHRONOS_KAFKA_BOOTSTRAP_SERVERS": bootstrap}
        for command in ("send", "tail"):
            runs[name, command] = subprocess.Popen(CHRONOS + [command], env=_env(**env), stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE, text=True)
        for role in ("consumer", "firer"):
            runs[name, role] = processes.start(role, **env)
    for (name, command), proc in runs.items():
        code = proc.wait(60)
        text = processes.log_of(proc) if command in ("consumer", "firer") else "".join(proc.communicate())
        assert code == EXIT_CONFIG, (name, command, text)
        assert text.count("refused the connection") == 1 and "certificate verify failed" in text, (name, command, text)
        assert "Traceback" not in text and KAFKA_SECRET not in text, (name, command)
        if command in ("send", "tail"):
            assert len(text.strip().splitlines()) == 1, text
    assert time.monotonic() - started < 30  # refused at once, not after the 10 s wait for an unreachable Kafka


@pytest.fixture(scope="module")
def sasl_proxy(tmp_path_factory: pytest.TempPathFactory, authority: Authority):
    """stunnel's TLS in front of the embedded broker with authentication required. It refuses every
    login: it offers SCRAM only, and its storage keeps no users (creating one is accepted and dropped)."""
    base = tmp_path_factory.mktemp("sasl-broker")
    port = free_port()
    proxy = TlsProxy(base, port, *authority.issue("kafka-sasl"))
    url, advertised = f"tcp://127.0.0.1:{port}", f"tcp://{proxy.address}"
    broker = subprocess.Popen([broker_bin(), "broker", "--listener-url", url, "--advertised-listener-url", advertised,
                               "--storage-engine", BROKER_STORAGE, "--authentication"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: broker.poll() is not None or tcp_accepts(port), 30, "the broker listening", every=0.05)
        assert broker.poll() is None, "the broker exited"
        proxy.start()
        yield proxy
    finally:
        proxy.stop()
        broker.send_signal(signal.SIGINT)
        broker.wait(10)


def test_a_refused_sasl_login_is_one_line_and_final(processes, tls_env, sasl_proxy, authority, tmp_path):
    """SASL over TLS (SASL_SSL, SCRAM-SHA-512, the secrets in the properties file) to a broker that refuses
    the login, as a wrong password is refused: `send`, `tail`, the consumer and the firer end at once with one
    line saying so (exit 2), and the password never shows."""
    props = _properties(tmp_path / "sasl.properties", authority.ca_file, **{"security.protocol": "SASL_SSL",
                                                                           "sasl.mechanism": "SCRAM-SHA-512"})
    env = {**tls_env, "CHRONOS_KAFKA_PROPERTIES_FILE": str(props), "CHRONOS_KAFKA_BOOTSTRAP_SERVERS": sasl_proxy.address}
    runs = {command: subprocess.Popen(CHRONOS + [command], env=_env(**env), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for command in ("send", "tail")}
    runs.update({role: processes.start(role, **env) for role in ("consumer", "firer")})
    for command, proc in runs.items():
        code = proc.wait(60)
        text = processes.log_of(proc) if command in ("consumer", "firer") else "".join(proc.communicate())
        assert code == EXIT_CONFIG, (command, text)
        assert text.count("refused the connection") == 1 and "SASL authentication error" in text, (command, text)
        assert "Traceback" not in text and KAFKA_SECRET not in text, command


def test_chronos_up_runs_against_external_services_over_tls(tmp_path, tls_env, tls_broker, authority, database_url):
    """`chronos up` with a TLS broker and PostgreSQL over verified TLS as the least-privilege role (migrated
    beforehand by its owner): the programs, `send`, `tail`, `status` and the console all work. When the
    broker's certificate moves to a new authority, the programs take the new CA file once restarted
    through supervisord (librdkafka reads it when a client is made) by the TLS page's command, run as written
    in the directory `chronos up` runs in, without restarting `chronos up`."""
    url = app_url(database_url, authority.ca_file)
    ready = tmp_path / ".chronos" / "ready.json"  # `chronos up` in a reader's directory: its data directory there
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    env = _env(**{k: v for k, v in tls_env.items() if k != "CHRONOS_DATABASE_URL"}, CHRONOS_DATABASE_URL=url,
               CHRONOS_CONSOLE_PORT="0")
    up = subprocess.Popen(CHRONOS + ["up"], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True)
    try:
        wait_for(lambda: ready.exists() or up.poll() is not None, 120, "chronos up ready")
        assert up.poll() is None, up.stdout.read() if up.stdout else ""
        info = orjson.loads(ready.read_bytes())
        assert info["bootstrap_servers"] == tls_env["CHRONOS_KAFKA_BOOTSTRAP_SERVERS"]
        _send_and_tail(env, "up-over-tls")
        status = subprocess.run(CHRONOS + ["status", "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        assert orjson.loads(status.stdout)["waiting"] == 0
        if info["console_url"]:  # the console extra is installed with the dev extra
            with urllib.request.urlopen(info["console_url"], timeout=10) as page:
                assert page.status == 200
        assert APP_PASSWORD not in status.stdout + status.stderr

        new_authority = Authority("rotated", tmp_path / "rotated")
        bundle = tmp_path / "cas.pem"
        bundle.write_bytes(authority.ca_file.read_bytes() + new_authority.ca_file.read_bytes())
        _properties(Path(tls_env["CHRONOS_KAFKA_PROPERTIES_FILE"]), bundle)
        tls_broker[1].restart(*new_authority.issue("kafka-new-ca"))
        (block,) = page_blocks(ROOT / "docs" / "operations" / "tls-and-sasl.md", "restart up")
        restart = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=90, env=env)
        assert restart.returncode == 0, restart.stdout + restart.stderr
        _send_and_tail(env, "after-new-ca", nth=2)
        # the ready file hands the database URL to the other commands: only its owner may read it, and the
        # properties file's secrets are not copied into it
        assert ready.stat().st_mode & 0o077 == 0 and KAFKA_SECRET not in ready.read_text()
    finally:
        tls_broker[1].restart(*authority.issue("kafka"))
        up.send_signal(signal.SIGTERM)
        out = up.communicate(timeout=90)[0]
    assert up.returncode == 0, out
    assert APP_PASSWORD not in out and KAFKA_SECRET not in out
    for log in (tmp_path / ".chronos" / "logs").glob("*.log"):
        text = log.read_text(errors="replace")
        assert APP_PASSWORD not in text and KAFKA_SECRET not in text, log.name


def test_a_rotated_broker_certificate_is_picked_up_without_a_restart(processes, tls_env, tls_broker, authority):
    """The broker's certificate is replaced by a new one from the same authority (the proxy restarted with
    it, dropping every connection): the running processes reconnect, verify it and go on."""
    _, proxy = tls_broker
    procs = [processes.start(role, **tls_env) for role in ROLES]
    for proc in procs:
        processes.wait_for_log(proc, "starting: node")
    env = _env(**tls_env)
    _send_and_tail(env, "before-rotation")
    proxy.restart(*authority.issue("kafka-rotated"))
    _send_and_tail(env, "after-rotation", nth=2)
    for proc in procs:
        assert proc.poll() is None, processes.log_of(proc)
