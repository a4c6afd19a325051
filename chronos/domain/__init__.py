"""The pure domain: model types, intake decisions, cron occurrences, fire-rate limits. No I/O."""
