"""The fleet's Kafka: the embedded broker on a host of its own (kafka-1), advertising its bridge address, its
topics, and the consumer group's state as the client host sees it."""

from __future__ import annotations

from kits.fleet.common import KAFKA_PORT, Servers, plain_env, wait
from kits.network import Network

GROUP = "chronos"  # the hosts' consumer group (CHRONOS_CONSUMER_GROUP's default)


class Broker:
    """The broker on `host`, with the topics of Chronos's defaults, `partitions` each."""

    def __init__(self, net: Network, servers: Servers, *, host: str = "kafka-1", partitions: int = 4):
        self.net, self.servers, self.host, self.partitions = net, servers, host, partitions
        self.topics = {"input": "chronos.input", "output": "chronos.output", "dlq": "chronos.dlq"}

    @property
    def bootstrap(self) -> str:
        """The broker, by address: for clients that run in the test process (which knows no host names)."""
        return f"{self.net[self.host].address}:{KAFKA_PORT}"

    @property
    def bootstrap_by_name(self) -> str:
        """The broker, by name: as the Chronos hosts have it (their /etc/hosts names it)."""
        return f"{self.host}:{KAFKA_PORT}"

    def start(self) -> None:
        from chronos.embedded.broker import BROKER_STORAGE, broker_bin
        listener = f"tcp://{self.bootstrap}"
        self.servers.spawn(self.host, self.host, [broker_bin(), "broker", "--listener-url", listener,
                                                  "--advertised-listener-url", listener, "--storage-engine", BROKER_STORAGE],
                           plain_env(RUST_LOG="warn", NO_COLOR="1"))

    def create_topics(self) -> None:
        """Once the broker answers, its topics created, from the client host."""
        from chronos.adapters.kafka.admin import create_topics
        with self.net.inside("client"):
            wait(self._answers, 30, "the broker answering")
            create_topics(self.bootstrap, {t: self.partitions for t in self.topics.values()})

    def _answers(self) -> bool:
        from confluent_kafka.admin import AdminClient
        try:
            AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
            return True
        except Exception:  # noqa: BLE001 - not up yet: asked again
            return False

    def group_state(self) -> str:
        """The consumer group's state on the broker (STABLE, EMPTY, ...: ConsumerGroupState's names), asked
        from the client host."""
        from confluent_kafka.admin import AdminClient
        with self.net.inside("client"):
            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            try:
                (future,) = admin.describe_consumer_groups([GROUP], request_timeout=5).values()
                described = future.result()
            except Exception as exc:  # noqa: BLE001 - an answer of its own: asked again by the caller
                return f"no answer ({exc})"
        return described.state.name

    def wait_group_settled(self, timeout: float = 30.0) -> str:
        """Until the consumer group is STABLE (its members hold their partitions) or EMPTY (no member)."""
        return wait(lambda: (state := self.group_state()) in ("STABLE", "EMPTY") and state, timeout,
                    "the consumer group settled")
