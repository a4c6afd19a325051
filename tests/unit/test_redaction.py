"""Database passwords are redacted in every form libpq accepts, and in driver errors that echo them."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from chronos import config

# (the database URL or conninfo string, what redaction leaves, the password as libpq reads it)
FORMS = [
    ("postgresql://app:s3cret@db:5432/x?sslmode=require", "postgresql://app:***@db:5432/x?sslmode=require", "s3cret"),
    ("postgresql://app:p%40ss%2Fw@db/x", "postgresql://app:***@db/x", "p@ss/w"),
    ("postgres://:s3cret@db/x", "postgres://:***@db/x", "s3cret"),
    ("postgresql://app@db/x?password=s3cret", "postgresql://app@db/x?password=***", "s3cret"),
    ("postgresql://app@db/x?sslmode=require&password=s3%26cret&connect_timeout=3",
     "postgresql://app@db/x?sslmode=require&password=***&connect_timeout=3", "s3&cret"),
    ("postgresql://app@db/x?pass%77ord=s3cret", "postgresql://app@db/x?pass%77ord=***", "s3cret"),
    ("postgresql://app@db/x?sslpassword=k3y&sslkey=/k.pem", "postgresql://app@db/x?sslpassword=***&sslkey=/k.pem",
     None),
    ("host=db user=app password=s3cret dbname=x", "host=db user=app password=*** dbname=x", "s3cret"),
    ("host=db password = s3cret", "host=db password = ***", "s3cret"),
    ("password='a b\\' c' host=db", "password=*** host=db", "a b' c"),
    ("host=db password=back\\ slash", "host=db password=***", "back slash"),
    ("host=db sslpassword='k y' sslkey=/k.pem", "host=db sslpassword=*** sslkey=/k.pem", None),
    ("dbname=postgresql://app:s3cret@db/x", "dbname=postgresql://app:***@db/x", "s3cret"),
    ("postgresql://app:s3cret@db1:5432,db2:5433/x?target_session_attrs=read-write",
     "postgresql://app:***@db1:5432,db2:5433/x?target_session_attrs=read-write", "s3cret"),
]


@pytest.mark.parametrize("url,shown,password", FORMS, ids=[f[0][:40] for f in FORMS])
def test_every_form_of_password_is_redacted(url, shown, password):
    assert config.redact_url(url) == shown
    if password is not None:
        params = conninfo_to_dict(url)
        if "://" in params.get("dbname", ""):  # libpq expands a URL given as dbname when it connects
            params = conninfo_to_dict(params["dbname"])
        assert params.get("password") == password  # the form really is what libpq reads
        assert password in config.database_passwords(url)


# unescaped characters libpq does not read as the user meant; none of the password may show
MALFORMED = [
    ("postgresql://app:pw/with/slashes@db/x", "postgresql://app:***@db/x", "pw/with/slashes"),
    ("postgresql://app:p@ss@db/x", "postgresql://app:***@db/x", "p@ss"),
    ("postgresql://app:p?ss@db/x?sslmode=require", "postgresql://app:***@db/x?sslmode=require", "p?ss"),
    ("postgresql://app:two words@db/x", "postgresql://app:***@db/x", "two words"),
    ("host=db password='never closed", "host=db password=***", "never closed"),
]


@pytest.mark.parametrize("url,shown,password", MALFORMED, ids=[f[0][:40] for f in MALFORMED])
def test_unescaped_passwords_are_redacted_whole(url, shown, password):
    assert config.redact_url(url) == shown
    assert password in config.database_passwords(url)


def test_urls_without_a_password_are_left_alone():
    for url in ("postgresql://db/x", "postgresql://app@db:5432/x?sslmode=require&user=a@b",
                "host=db user=app dbname=x", "postgresql://[::1]:5432/x"):
        assert config.redact_url(url) == url
        assert config.database_passwords(url) == []


def test_a_message_holding_urls_and_known_secrets_is_redacted():
    text = ('cannot connect to postgresql://app:s3cret@db/x: invalid integer value "pw" for connection '
            'option "port"; see host=db password=other')
    assert config.redact_url(text, ["pw"]) == ('cannot connect to postgresql://app:***@db/x: invalid integer value '
                                               '"***" for connection option "port"; see host=db password=***')


def test_settings_know_every_form_of_the_database_password():
    """What the log filter masks: the settings accept URLs only (a conninfo string is refused)."""
    for url, _, password in FORMS + MALFORMED:
        if password is not None and url.startswith("postgres"):
            settings = config.load(None, environ={"CHRONOS_DATABASE_URL": url}, default_ready_file=False)
            assert password in settings.secrets(), url


def test_a_conninfo_string_is_refused_without_echoing_its_password():
    with pytest.raises(config.ConfigError) as caught:
        config.load(None, environ={"CHRONOS_DATABASE_URL": "host=db password='a b\\' c'"}, default_ready_file=False)
    assert "password=***" in str(caught.value) and "a b" not in str(caught.value)
