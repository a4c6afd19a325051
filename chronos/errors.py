"""The project's exception tree and the process exit codes that go with it."""

EXIT_OK = 0            # success
EXIT_FAILURE = 1       # unexpected error (and `chronos show`: no such message)
EXIT_CONFIG = 2        # bad configuration value or flag
EXIT_UNAVAILABLE = 3   # a service (PostgreSQL, Kafka) cannot be reached at start
EXIT_SCHEMA = 4        # database not migrated (or migrated by a newer version, or too old a PostgreSQL)
EXIT_EMBEDDED = 5      # an embedded service (PostgreSQL, broker, supervisord) failed to start
EXIT_NOT_FOUND = 6     # an operator action named ids that are not in the store
EXIT_CONFIRM = 7       # an operator action would change more messages than allowed without --yes
EXIT_IN_FLIGHT = 8     # an operator action left messages alone because a firer is publishing them
EXIT_REFUSED = 9       # a replay of parked messages left some parked: Kafka refused them, or their topic is not allowed


class ChronosError(Exception):
    """Base class; `exit_code` is what the CLI exits with."""

    exit_code = EXIT_FAILURE


class ConfigError(ChronosError):
    exit_code = EXIT_CONFIG


class UnavailableError(ChronosError):
    exit_code = EXIT_UNAVAILABLE


class SchemaError(ChronosError):
    exit_code = EXIT_SCHEMA


class UnsupportedServer(SchemaError):
    """PostgreSQL is older than the oldest version Chronos supports."""


class StoreUnavailable(ChronosError):
    """PostgreSQL could not be reached or the connection broke mid-operation."""

    exit_code = EXIT_UNAVAILABLE


class StoreRefused(StoreUnavailable):
    """PostgreSQL refused this client (its password, its TLS settings or the server's certificate):
    retrying with the same settings cannot help. A process exits on it at start (exit code 2); once
    running, it waits and retries like through any outage, since the settings may be in rotation."""

    exit_code = EXIT_CONFIG


class PoolModeMismatch(ConfigError):
    """PostgreSQL is reached through a transaction pooler (PgBouncer's pool_mode=transaction, or the like)
    while CHRONOS_DATABASE_POOL_MODE says session: a prepared statement or the staging table vanished
    between two statements of one connection. Final, like any configuration error: restarting with the
    same setting fails the same way."""


class KafkaRefused(ConfigError):
    """Kafka refused this client's TLS or SASL settings (or this client refused the broker's certificate):
    retrying with the same settings cannot help."""


class ClaimContended(ChronosError):
    """A firer's claim that deletes found a row it had chosen taken by another firer meanwhile: its batch was
    rolled back, nothing of it held, and the claim is made again (not an outage)."""


class StoreRejected(ChronosError):
    """PostgreSQL refused the data itself (not the connection): retrying the same data cannot help."""


class NotFound(ChronosError):
    """An operator action named ids that are not in the store (not waiting, in flight or recurring)."""

    exit_code = EXIT_NOT_FOUND


class NeedsConfirmation(ChronosError):
    """An operator action would change more messages than the confirmation threshold allows without --yes."""

    exit_code = EXIT_CONFIRM


class InFlightSkipped(ChronosError):
    """An operator action left some messages alone because a firer is publishing them."""

    exit_code = EXIT_IN_FLIGHT


class ReplayRefused(ChronosError):
    """A replay of parked messages left some of them parked: Kafka refused them (each has the refusal as
    its new reason), or CHRONOS_ALLOWED_TOPICS does not allow the topic they were going to."""

    exit_code = EXIT_REFUSED


class InputError(ConfigError):
    """A pipeline job's input is missing or has the wrong schema (exit code 2, like a bad flag)."""


class StackError(ChronosError):
    """`chronos up` cannot run its stack: the data directory is taken, supervisord or a program failed."""

    exit_code = EXIT_EMBEDDED


class KafkaUnanswered(ChronosError):
    """Kafka did not answer a client's request in time (an outage, or a coordinator out of reach)."""

    exit_code = EXIT_UNAVAILABLE


class CellMapChanged(ChronosError):
    """A write to a cell was refused, and rolled back, because the cell no longer owns one of its partitions
    at the epoch the writer knew (the map changed since it was read): read the map again and write again."""


class CellsUnsupported(SchemaError):
    """A cell's database is at a schema before cells (version 11): `chronos migrate` it."""
