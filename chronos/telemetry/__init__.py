"""A process's own telemetry: its role's Prometheus metrics (metrics.py), its health (health.py), the small HTTP
server of /metrics and /healthz (http.py), and the port it listens on (endpoints.py)."""
