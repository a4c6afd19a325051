"""The Kubernetes manifests run by podman as far as it goes here: a pod (no infra container: podman's failed on
this machine's limits) with the migration Job's container run to its end on an empty database, then one
container of each Deployment, each with its manifest's image, arguments, environment (the ConfigMap, the Secret's
values and files), user, read-only root, capabilities and memory limit. The test is the kubelet: it waits for
each startup probe, then asks the readiness and liveness probes, sends a message through, and stops each
container with its pod's grace period.

What is the cluster's is this test's: the database's and brokers' addresses, the topics and the Kafka client's
properties (no TLS or SASL on the tests' broker), and each container's metrics port (the three share the host's
network here, where each pod would have an address of its own)."""

from __future__ import annotations

import time
import uuid

import pytest

from kits.podman import Container, podman, run
from chronos import __version__
from chronos.embedded.procs import free_port
from helpers import EMBEDDED_KAFKA, Collector, chronos_headers, producer, send, wait_for
from containerkit import ROLES, container_of, deployment, grace_s, podman_options, resource
from test_roles import probe

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def pod():
    name = f"chronos-k8s-{uuid.uuid4().hex[:8]}"
    podman("pod", "create", "--infra=false", "--name", name)
    yield name
    podman("pod", "rm", "--force", "--time", "0", name, check=False)


def test_the_manifests_run_in_a_pod(pod, image, empty_database_url, broker, topics, tmp_path):
    cluster = {"CHRONOS_DATABASE_URL": empty_database_url, "CHRONOS_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
               "CHRONOS_INPUT_TOPIC": topics["input"], "CHRONOS_OUTPUT_TOPIC": topics["output"],
               "CHRONOS_DLQ_TOPIC": topics["dlq"], "CHRONOS_ALLOWED_TOPICS": topics["output"]}
    properties = "".join(f"{key}={value}\n" for key, value in EMBEDDED_KAFKA.items())

    def start(workload: dict, **env: str) -> Container:
        spec = container_of(workload)
        assert spec["image"] == f"chronos:{__version__}"  # this checkout's, which `make image` tagged so
        options, manifest_env = podman_options(workload, tmp_path / workload["metadata"]["name"])
        files = tmp_path / workload["metadata"]["name"] / "secrets"
        if (files / "kafka.properties").exists():
            (files / "kafka.properties").chmod(0o644)
            (files / "kafka.properties").write_text(properties)
        return run(image, *spec["args"], env={**manifest_env, **cluster, **env},
                   options=("--pod", pod, "--read-only-tmpfs=false", *options))

    job = resource("Job", "chronos-migrate")
    migrate = start(job)
    assert podman("wait", migrate.name, timeout=120).stdout.strip() == "0", migrate.logs()
    assert "schema at version" in migrate.logs()

    ports = {role: free_port() for role in ROLES}
    started = {role: start(deployment(role), CHRONOS_METRICS_PORT=str(ports[role])) for role in ROLES}
    for role in ROLES:
        spec = container_of(deployment(role))
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            path = spec[kind]["httpGet"]["path"]
            wait_for(lambda: probe(ports[role], path)[0] == 200, timeout=60, what=f"the {role}'s {kind} ({path})")
    collect = Collector(broker.bootstrap_servers, [topics["output"]])
    try:
        p = producer(broker.bootstrap_servers)
        send(p, topics["input"], b"k", b"through the pod", chronos_headers(f"pod-{uuid.uuid4().hex[:8]}", time.time() + 1))
        p.flush(10)
        (got,) = collect.until(lambda messages: messages, timeout=30)
        assert got.value == b"through the pod"
    finally:
        collect.close()
    for role, container in started.items():
        took = container.stop(grace_s(role))
        assert container.exit_code == 0 and took < grace_s(role), container.logs()[-3000:]
