"""The operators' commands: `chronos status` and `health`, what the store holds and the actions on it
(inspect.py), the servers the processes use (servers.py), `chronos rewind`."""
