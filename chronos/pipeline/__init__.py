"""The data pipeline: Spark jobs for work that outgrows one process.

- `chronos.pipeline.schedule`: bulk scheduling of a dataset of messages into the store, validated
  by the consumer's rules (the header codec and `chronos.domain.intake.decide`), written with one COPY
  stream per Spark partition.
- `chronos.pipeline.report`: SLA analytics over delivery records (jitter percentiles, throughput,
  verdict), with charts drawn by `chronos.pipeline.charts`.

PySpark comes with the `spark` extra (`pip install 'chronos-scheduler[spark]'`). Only the modules
that run Spark import it, and only when a command runs: the service processes never load it.
"""
