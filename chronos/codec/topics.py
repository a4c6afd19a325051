"""What a Kafka topic name may be: one definition for the settings, the header codec and the
fire-rate limits' topic patterns."""

from __future__ import annotations

import re

#: The characters of a topic name, as the body of a regular expression's character class ('-' last).
TOPIC_CHARS = "A-Za-z0-9._-"
#: Kafka's longest topic name.
MAX_TOPIC_LENGTH = 249

_TOPIC_RE = re.compile(f"[{TOPIC_CHARS}]{{1,{MAX_TOPIC_LENGTH}}}")


def is_topic_name(name: str) -> bool:
    """A name Kafka accepts: 1-249 of those characters, and not "." or ".."."""
    return _TOPIC_RE.fullmatch(name) is not None and name not in (".", "..")
