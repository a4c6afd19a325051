"""The kit's own bootstrap of a new cluster: the application's role and database, made once, as an operator
makes them by hand on a PostgreSQL of their own (Install on a host). The only SQL Chronos runs outside its
store adapter, and never on an installation's database."""

from __future__ import annotations

from chronos.embedded.patroni.config import APP_DATABASE, APP_USER


def create_app_database(admin_url: str, app_password: str) -> None:
    """The application's role (which may create tables) and database, made once."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_USER,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(APP_USER), sql.Literal(app_password)))
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (APP_DATABASE,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(APP_DATABASE), sql.Identifier(APP_USER)))
