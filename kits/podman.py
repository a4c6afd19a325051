"""Chronos's container image run by podman: for the container tests (tests/containers) and the measurement of
the processes' resources in containers (benchmarks/containers.py).

The image is the one `make image` builds (deploy/image/build.py); `make_image` runs it and names what it
made. Containers run with the host's network (`--network host`), so that they reach the PostgreSQL and the
broker the tests start on the loopback, and with a read-only root, as the Kubernetes manifests run them.

podman reads this machine's settings from `containers.conf` beside this file (`CONTAINERS_CONF`): the
runtime runc (crun refuses a machine whose cgroups are v1), the cgroupfs manager (no systemd here) and
resource limits no higher than the shell's, which runc cannot raise. Values from the environment are handed
to a container by name (`--env NAME`), so that no password ever stands on podman's command line.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

ROOT = Path(__file__).resolve().parents[1]
CONTAINERS_CONF = Path(__file__).with_name("containers.conf")
# one line per tag `make image` names: "localhost/chronos:0.2.0 0b5ced5c36bc 201 MB built in 99 s"
MADE = re.compile(r"^(?P<tag>\S+) (?P<id>[0-9a-f]{12}) (?P<mb>\d+) MB (?P<how>built in (?P<s>\d+) s|up to date)$", re.M)


class PodmanError(RuntimeError):
    pass


def podman_env(**extra: str) -> dict[str, str]:
    """This process's environment without Chronos's settings, with this machine's podman settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOS_")}
    return {**env, "CONTAINERS_CONF": str(CONTAINERS_CONF), **extra}


def podman(*args: str, check: bool = True, timeout: float = 120.0,
           env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                          env=podman_env(**(env or {})))
    if check and done.returncode != 0:
        raise PodmanError(f"podman {' '.join(args[:4])} ... failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done


@dataclass
class Made:
    """One image `make image` named."""

    tag: str
    id: str
    mb: int
    built_s: int | None  # None: it was up to date


def made_images(output: str) -> dict[str, Made]:
    """What `make image` printed it made or found, by tag."""
    return {m["tag"]: Made(m["tag"], m["id"], int(m["mb"]), int(m["s"]) if m["s"] else None)
            for m in MADE.finditer(output)}


def shell(code: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    """Run a page's shell block as written, in the checkout, with this machine's podman settings; a failure is a
    PodmanError with what it printed."""
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=podman_env())
    if done.returncode != 0:
        raise PodmanError(f"{code}\nfailed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def make_image(command: str = "make image", timeout: float = 1800.0) -> tuple[dict[str, Made], str]:
    """Run `command` (the containers page's build command) in the checkout: (what it made, its output)."""
    done = shell(command, timeout)
    made = made_images(done.stdout)
    if not made:
        raise PodmanError(f"{command} named no image:\n{done.stdout}\n{done.stderr}")
    return made, done.stdout + done.stderr


class Container:
    """A container started detached; removed by `remove` (its logs with it)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"Container({self.name})"

    def inspect(self, template: str) -> str:
        return podman("inspect", "--format", template, self.name).stdout.strip()

    @property
    def running(self) -> bool:
        return self.inspect("{{.State.Running}}") == "true"

    @property
    def pid(self) -> int:
        """The host's pid of the container's first process (tini)."""
        return int(self.inspect("{{.State.Pid}}"))

    @property
    def exit_code(self) -> int:
        return int(self.inspect("{{.State.ExitCode}}"))

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def wait_for_log(self, text: str, timeout: float = 60.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            logs = self.logs()
            if text in logs:
                return logs
            if not self.running:
                raise PodmanError(f"{self.name} ended ({self.exit_code}) before logging {text!r}:\n{logs[-4000:]}")
            time.sleep(0.2)
        raise PodmanError(f"{self.name}: {text!r} not logged within {timeout:.0f}s:\n{self.logs()[-4000:]}")

    def exec(self, *command: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        return podman("exec", self.name, *command, check=False, timeout=timeout)

    def stop(self, grace_s: int) -> float:
        """`podman stop` with a grace period, as a kubelet stops a pod (SIGTERM, SIGKILL after the grace
        period): how long it took."""
        started = time.monotonic()
        podman("stop", "--time", str(grace_s), self.name, timeout=grace_s + 60)
        return time.monotonic() - started

    def kill(self) -> None:
        """SIGKILL every process of the container at once: it gets no chance to stop anything."""
        podman("kill", "--signal", str(int(signal.SIGKILL)), self.name)
        podman("wait", self.name, timeout=60)

    def remove(self) -> None:
        podman("rm", "--force", "--time", "0", self.name, check=False)


def run(image: str, *command: str, env: Mapping[str, str] | None = None, name: str | None = None,
        options: tuple[str, ...] = ()) -> Container:
    """Start `image` with `command` (the arguments of its entry point, `chronos`) detached, on the host's
    network, with a read-only root, dropping every capability; `env` is handed over by name."""
    name = name or f"chronos-test-{uuid.uuid4().hex[:8]}"
    env = dict(env or {})
    podman("run", "--detach", "--name", name, "--network", "host", "--read-only", "--cap-drop", "ALL",
           "--security-opt", "no-new-privileges", *(arg for key in env for arg in ("--env", key)), *options,
           image, *command, env=env, timeout=120)
    return Container(name)
