"""The three roles, each its own OS process: consumer, firer, failure detector."""
