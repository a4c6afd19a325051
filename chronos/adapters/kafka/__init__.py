"""The Kafka adapter: clients.py (client configuration, outage logging, publish failures classified,
the embedded broker's client profile), admin.py (reachability check, topic creation)."""
