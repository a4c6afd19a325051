"""A process's life: lifecycle and signals, backoff, logging, children that die with their parent."""
