"""`chronos up` as a subprocess in a temporary directory, driven like a user would."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from kits.stack import CHRONOS, ChronosUp, clean_env, supervisor
from chronos.embedded.procs import descendants
from chronos.up.datadir import SOCKET_PATH_MAX
from helpers import Collector, Received, exited

def send(info_file: Path, *args: str) -> str:
    out = subprocess.run(CHRONOS + ["send", "--ready-file", str(info_file), *args], env=clean_env(),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def only_output(info: dict) -> Received:
    """The one message on the stack's output topic (read from its start), once it is there."""
    collect = Collector(info["bootstrap_servers"], [info["output_topic"]])
    try:
        (m,) = collect.until(lambda ms: len(ms) >= 1, timeout=30)
    finally:
        collect.close()
    return m


def test_up_send_receive_and_clean_stop(tmp_path):
    up = ChronosUp(workdir=tmp_path).launch()
    try:
        info = up.wait_ready()
        assert "\nready bootstrap_servers=" in "\n" + up.output()
        assert {"bootstrap_servers", "database_url", "input_topic", "output_topic", "dlq_topic"} <= set(info)
        pids = [info["supervisord_pid"], info["postgres_pid"], info["broker_pid"], info["console_pid"],
                *up.program_pids()]
        assert len(pids) == 7
        assert info["console_url"].startswith("http://127.0.0.1:") and len(info["metrics_urls"]) == 3
        # the embedded broker's topics have one partition: its fetches list every batch a partition holds
        from chronos.adapters.kafka.admin import admin_client
        topics = admin_client(info["bootstrap_servers"]).list_topics(timeout=10).topics
        assert {len(topics[info[t]].partitions) for t in ("input_topic", "output_topic", "dlq_topic")} == {1}
        collect = Collector(info["bootstrap_servers"], [info["output_topic"]])
        sent_at = time.time()
        message_id = send(up.ready_file, "--delay", "2s", "--key", "K", "--value", "V", "--header", "h=1")
        assert len(message_id) == 36
        (m,) = collect.until(lambda ms: len(ms) >= 1, timeout=30)
        collect.close()
        assert (m.key, m.value) == (b"K", b"V")
        assert m.header_dict["h"] == b"1"
        assert m.at >= sent_at + 2 - 0.05
        names = sorted(up.programs())
        assert up.stop() == 0
        assert "stopped" in up.output()
        # every program was asked to stop before the first had stopped: together, not one role after another
        # (supervisord's own shutdown)
        supervisord = (up.log_dir / "supervisord.log").read_text()
        first_stopped = supervisord.index("stopped: ")
        assert all(0 <= supervisord.find(f"waiting for {name} to stop") < first_stopped for name in names), supervisord
        assert all(exited(pid) for pid in pids), up.output()
        assert not up.ready_file.exists()
    finally:
        up.kill()


def test_restart_keeps_waiting_messages(tmp_path):
    up = ChronosUp(workdir=tmp_path).launch()
    try:
        up.wait_ready()
        send(up.ready_file, "--delay", "12s", "--value", "survives", "--id", "keep-me")
        time.sleep(0.2)
        _wait_stored(tmp_path, "keep-me")
        assert up.stop() == 0
        up2 = ChronosUp("--no-console", workdir=tmp_path).launch()
        try:
            info = up2.wait_ready()
            assert info["console_url"] is None and info["console_pid"] is None and info["metrics_urls"] == []
            assert only_output(info).value == b"survives"
            assert up2.stop() == 0
        finally:
            up2.kill()
    finally:
        up.kill()


def _wait_stored(workdir: Path, message_id: str, timeout: float = 20) -> None:
    import psycopg
    info = orjson.loads((workdir / "ready.json").read_bytes())
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with psycopg.connect(info["database_url"]) as conn:
            if conn.execute("SELECT 1 FROM chronos_messages WHERE id = %s", (message_id,)).fetchone():
                return
        time.sleep(0.1)
    raise AssertionError(f"{message_id} not stored")


@pytest.fixture
def busy_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def refused(workdir: Path, *args: str, timeout: float = 60) -> tuple[int, str]:
    """`chronos up ARGS` that is expected to give up by itself: (exit code, output)."""
    up = ChronosUp(*args, workdir=workdir).launch()
    try:
        return up.proc.wait(timeout), up.output()
    finally:
        up.kill()


@pytest.mark.parametrize("flag", ["--pg-port", "--kafka-port"])
def test_occupied_port_is_a_clear_error(tmp_path, busy_port, flag):
    code, out = refused(tmp_path, flag, str(busy_port))
    assert code == 5
    assert f"port {busy_port} is already in use" in out
    assert not (tmp_path / "ready.json").exists()


def test_a_named_console_port_in_use_is_a_clear_error_before_anything_starts(tmp_path, busy_port):
    code, out = refused(tmp_path, "--console-port", str(busy_port), timeout=30)
    assert code == 2
    assert f"the console cannot listen on 127.0.0.1:{busy_port}" in out
    assert "started embedded PostgreSQL" not in out


def test_unreachable_database_url_is_a_clear_error(tmp_path, busy_port):
    # a listening socket that never speaks the protocol, then a closed port
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    code, out = refused(tmp_path, "--database-url", f"postgresql://app:topsecret@127.0.0.1:{port}/db")
    assert code == 3
    assert "cannot connect to PostgreSQL" in out
    assert "topsecret" not in out


def test_bad_configuration_value_is_a_clear_error(tmp_path):
    code, out = refused(tmp_path, "--hold-time-ms", "soon", timeout=30)
    assert code == 2
    assert "CHRONOS_HOLD_TIME_MS must be a whole number" in out


def test_a_bad_broker_memory_threshold_is_a_clear_error(tmp_path):
    code, out = refused(tmp_path, "--broker-memory-warning-mb", "2GB", timeout=30)
    assert code == 2
    assert "--broker-memory-warning-mb (CHRONOS_BROKER_MEMORY_WARNING_MB) must be a positive whole number of MB, " \
           "got '2GB'" in out


def test_broken_data_directory_is_a_clear_error(tmp_path):
    pgdata = tmp_path / ".chronos" / "pgdata"
    pgdata.mkdir(parents=True)
    (pgdata / "junk").write_text("not a database")
    code, out = refused(tmp_path)
    assert code == 5
    assert "pgdata" in out


def _stack_pids(up: ChronosUp, info: dict) -> set[int]:
    """Every process of a running `chronos up`: its children and all their descendants."""
    tree = set(descendants(up.proc.pid))
    named = {info["supervisord_pid"], info["postgres_pid"], info["broker_pid"], *up.program_pids()}
    assert named <= tree, (named, tree)
    return tree


def _wait_allexited(pids: set[int], timeout: float) -> set[int]:
    end = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < end:
        alive = {p for p in alive if not exited(p)}
        time.sleep(0.1)
    return alive


def test_a_killed_up_leaves_nothing_running_and_the_next_one_starts(tmp_path):
    up = ChronosUp(workdir=tmp_path).launch()
    try:
        info = up.wait_ready()
        pids = _stack_pids(up, info)
        assert len(pids) >= 6 and info["console_pid"] in pids
        up.kill()  # SIGKILL: no chance to stop anything itself
        survivors = _wait_allexited(pids, timeout=30)
        assert not survivors, [Path(f"/proc/{p}/cmdline").read_bytes() for p in survivors if not exited(p)]
        up2 = ChronosUp(workdir=tmp_path).launch()
        try:
            info2 = up2.wait_ready()
            assert "left" not in up2.output()  # nothing was left behind to stop
            send(up.ready_file, "--delay", "1s", "--value", "after the kill")
            assert only_output(info2).value == b"after the kill"
            assert up2.stop() == 0
        finally:
            up2.kill()
    finally:
        up.kill()


def test_processes_a_killed_up_left_behind_are_stopped_by_the_next_one(tmp_path):
    # a survivor that no parent-death signal reached, as on another OS: it carries the stack's mark
    data_dir = (tmp_path / ".chronos").resolve()
    env = clean_env(CHRONOS_STACK_DIR=str(data_dir))
    survivor = subprocess.Popen(["sleep", "300"], env=env)
    up = ChronosUp(workdir=tmp_path).launch()
    try:
        up.wait_ready(timeout=90)
        assert survivor.wait(5) == -signal.SIGTERM
        out = up.output()
        assert (f"an earlier chronos up of {data_dir} was killed and left 1 processes running: "
                f"sleep 300 (pid {survivor.pid}); stopping them") in out, out
        assert up.stop() == 0
    finally:
        up.kill()
        survivor.kill()
        survivor.wait()


def test_a_second_up_on_a_data_directory_in_use_refuses_and_touches_nothing(tmp_path):
    up = ChronosUp(workdir=tmp_path).launch()
    try:
        info = up.wait_ready()
        code, out = refused(tmp_path)
        assert code == 5
        assert (f"the data directory {(tmp_path / '.chronos').resolve()} is in use by another chronos up "
                f"(pid {up.proc.pid})") in out
        assert orjson.loads(up.ready_file.read_bytes()) == info
        assert up.proc.poll() is None
        assert up.stop() == 0
    finally:
        up.kill()


def test_a_data_directory_too_deep_for_a_unix_socket(tmp_path):
    """supervisord cannot bind a socket whose path passes sun_path's ~107 bytes: under a deep data
    directory its socket goes through a short link in /tmp, removed when the stack stops."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    assert len(str(deep / "run" / "supervisor.sock")) > SOCKET_PATH_MAX
    up = ChronosUp("--no-console", "--data-dir", str(deep), workdir=tmp_path)
    try:
        info = up.start()
        link = Path(info["supervisor_socket"]).parent
        assert link.is_symlink() and link.resolve() == (deep / "run").resolve()
        assert {p["statename"] for p in supervisor(info).programs()} == {"RUNNING"}
        send(up.ready_file, "--delay", "1s", "--value", "deep")
        assert only_output(info).value == b"deep"
        assert up.stop() == 0
        assert not link.exists() and not link.is_symlink()
    finally:
        up.kill()
