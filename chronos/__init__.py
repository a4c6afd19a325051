"""Chronos for Python: a persistent, highly available time-delay scheduler for Kafka."""

__version__ = "0.3.0"
