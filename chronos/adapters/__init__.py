"""Adapters: PostgreSQL (the store, its SQL and migrations), Kafka (clients, topics)."""
