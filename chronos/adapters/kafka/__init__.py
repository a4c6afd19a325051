"""The Kafka adapter: clients.py (client configuration, outage logging, the embedded broker's client
profile, and the confluent-kafka clients behind the Kafka ports), memory.py (their in-memory twin),
admin.py (reachability check, topic creation)."""
