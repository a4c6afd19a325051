"""`chronos rewind`: move the consumer group on the input topic back to a moment, after a restore
(chronos/ops/rewind.py does it)."""

from __future__ import annotations

import argparse
from datetime import timezone
from typing import Any

from chronos import config
from chronos.ops.rewind import ASSIGN_WAIT_S, parse_moment, rewind


def add_parser(sub: Any) -> None:
    p = sub.add_parser("rewind", help="move the consumer group on the input topic back to a moment (after a "
                                      "restore; Chronos's consumers stopped)",
                       description="Join the consumer group as its only member, commit on every partition of "
                                   "the input topic the first offset at or after --to, and leave: after a "
                                   "restore, the consumers read again what arrived since the backup. Uses the "
                                   "processes' Kafka settings (CHRONOS_KAFKA_PROPERTIES_FILE included). Commits "
                                   "nothing unless it gets every partition (a consumer still running keeps "
                                   "some).")
    config.add_arguments(p, only=("kafka_bootstrap_servers", "input_topic", "consumer_group", "kafka_properties",
                                  "kafka_properties_file"))
    p.add_argument("--to", required=True, metavar="TIME",
                   help="the moment, ISO-8601 with its zone: 2026-11-26T06:14:13Z or ...+01:00 (no zone is refused)")
    p.add_argument("--dry-run", action="store_true", help="print the offsets, commit nothing")
    p.add_argument("--wait", type=float, default=ASSIGN_WAIT_S, metavar="SECONDS",
                   help=f"how long to wait for every partition (default {ASSIGN_WAIT_S:.0f})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    moment = parse_moment(args.to)
    settings = config.load(args)
    moved = rewind(settings, moment, dry_run=args.dry_run, assign_wait=args.wait)
    verb = "would move" if args.dry_run else "moved"
    print(f"group {settings.consumer_group} on {settings.input_topic} {verb} to "
          f"{moment.astimezone(timezone.utc).isoformat().replace('+00:00', 'Z')}:")
    for m in moved:
        print(f"  partition {m.partition}: {'-' if m.was < 0 else m.was} -> {m.now}")
    return 0
