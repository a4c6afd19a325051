"""TLS for the tests: certificate authorities and certificates made on the spot, Debian's PostgreSQL 15
(the embedded PostgreSQL has no TLS) with the least-privilege role production runs Chronos as, and a
TLS-terminating proxy (Debian's stunnel) in front of the embedded broker. The Makefile installs both
Debian packages.

The embedded broker's own TLS cannot be switched on: its command line accepts `--cert` or `--key` but
refuses both together, and starts TLS only with both. Its SASL cannot log anyone in: it offers SCRAM
only, its storage engine (the only one built in) accepts a new user and keeps nothing, and with
authentication required it refuses even the request that would create one. So the Kafka TLS tests put
stunnel, a real TLS server, in front of it, the broker advertising the proxy's address so that clients
reconnect through the proxy too; with authentication required it serves the tests of a refused login.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from chronos.embedded.procs import HOST, free_port, tcp_accepts

PG15_BIN = Path("/usr/lib/postgresql/15/bin")

APP_ROLE = "chronos_app"
APP_PASSWORD = "App-S3cret-pw-1"
# The grants the processes, `chronos status` and the operators' commands need, and no more (the
# production checklist in docs/operations lists them, with CONNECT and TEMPORARY on the database, which
# PUBLIC holds by default): the rows of the tables `chronos migrate` made.
APP_GRANTS = (f"GRANT USAGE ON SCHEMA public TO {APP_ROLE}",
              f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {APP_ROLE}")


def require_pg15() -> Path:
    """Debian's PostgreSQL 15 binaries, or the test fails saying how to install them."""
    if not (PG15_BIN / "postgres").is_file():
        pytest.fail(f"Debian's PostgreSQL 15 server is not installed in {PG15_BIN}: run `make test` as root, "
                    "or apt-get install postgresql-15")
    return PG15_BIN


def require_stunnel() -> str:
    """Debian's stunnel, or the test fails saying how to install it."""
    found = shutil.which("stunnel4") or shutil.which("stunnel")
    if not found:
        pytest.fail("Debian's stunnel is not installed: run `make test` as root, or apt-get install stunnel4")
    return found


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    return path


class Authority:
    """A certificate authority of its own: its certificate (for clients to trust) is `ca_file`."""

    def __init__(self, name: str, directory: Path):
        self.name, self.directory = name, directory
        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=2))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.ca_file = directory / f"{name}-ca.pem"
        self.ca_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, hosts: tuple[str, ...] = (HOST,)) -> tuple[Path, Path]:
        """A server certificate for `hosts` (IP addresses or DNS names) signed by this authority:
        (certificate file, key file)."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(self.cert.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .sign(self.key, hashes.SHA256()))
        cert_file = self.directory / f"{self.name}-{name}.crt"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cert_file, _write_key(key, self.directory / f"{self.name}-{name}.key")


class TlsProxy:
    """stunnel accepting TLS on 127.0.0.1:port with a certificate and key, forwarding plaintext to
    127.0.0.1:target. `restart` serves another certificate on the same port (a rotation)."""

    def __init__(self, directory: Path, target: int, cert: Path, key: Path):
        self.directory, self.target, self.cert, self.key = directory, target, cert, key
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = directory / "stunnel.log"

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self) -> None:
        conf = self.directory / "stunnel.conf"
        conf.write_text(f"foreground = yes\npid =\ndebug = 4\noutput = {self.log}\n"
                        f"[kafka]\naccept = {self.address}\nconnect = {HOST}:{self.target}\n"
                        f"cert = {self.cert}\nkey = {self.key}\n")
        self.proc = subprocess.Popen([require_stunnel(), str(conf)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for _ in range(200):  # it forks nothing in the foreground: listening means ready
            if self.proc.poll() is not None:
                raise RuntimeError(f"stunnel exited ({self.proc.returncode}): {self.log.read_text(errors='replace')}")
            if tcp_accepts(self.port):
                return
            try:
                self.proc.wait(0.05)
            except subprocess.TimeoutExpired:
                pass
        raise RuntimeError(f"stunnel does not listen on {self.address}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def restart(self, cert: Path, key: Path) -> None:
        self.stop()
        self.cert, self.key = cert, key
        self.start()


def app_url(database_url: str, ca_file: Path, *, host: str = "127.0.0.1", password: str | None = APP_PASSWORD,
            **params: str) -> str:
    """`database_url`'s database as `chronos_app` over TLS that checks the server's certificate against
    `ca_file` and its name (sslmode=verify-full)."""
    parts = urlsplit(database_url)
    userinfo = APP_ROLE + (f":{password}" if password is not None else "")
    query = "&".join(f"{k}={v}" for k, v in {"sslmode": "verify-full", "sslrootcert": str(ca_file), **params}.items())
    return f"postgresql://{userinfo}@{host}:{parts.port}{parts.path}?{query}"
