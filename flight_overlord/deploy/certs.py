"""``overlord certs DIR``: a development CA and the certificates TLS and mutual TLS need.

- ``ca.pem`` / ``ca.key``: a self-signed CA (keep ``ca.key`` away from the run; it signs more).
- ``server.pem`` / ``server.key``: every role's certificate, for 127.0.0.1, localhost and the
  ``--host`` names, with both the server-auth and the client-auth extended key usage: under
  mutual TLS a role presents it when it calls another role.
- ``client.pem`` / ``client.key``: a trainer's (or an operator's) client certificate (client-auth).

For development and tests; in production use your PKI and name its files in ``security.tls``.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from ..config import ConfigError


def make_certs(out: str | os.PathLike, *, hosts: tuple[str, ...] = (), days: int = 365) -> dict[str, Path]:
    """Write the files above into ``out``; keys are 0600. Returns name -> path."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise ConfigError("overlord certs needs the cryptography package: "
                          "pip install 'flight_overlord[security]'") from None

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "flight_overlord development"),
                          x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def builder(subject, issuer, key, issuer_key) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                               critical=False))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (builder(name("flight_overlord development CA"), name("flight_overlord development CA"), ca_key, ca_key)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(common: str, usages: list, sans: list | None):
        key = ec.generate_private_key(ec.SECP256R1())
        b = (builder(name(common), ca.subject, key, ca_key)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                          data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                          crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
             .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return b.sign(ca_key, hashes.SHA256()), key

    sans: list = []
    for host in ("127.0.0.1", "localhost", *hosts):
        try:
            entry = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            entry = x509.DNSName(host)
        if entry not in sans:
            sans.append(entry)
    server, server_key = leaf("overlord role", [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
                              sans)
    client, client_key = leaf("overlord trainer", [ExtendedKeyUsageOID.CLIENT_AUTH], None)

    written = {}

    def write(filename: str, data: bytes, private: bool) -> None:
        path = out / filename
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
        try:
            if private:
                os.fchmod(fd, 0o600)
            os.write(fd, data)
        finally:
            os.close(fd)
        written[filename] = path

    def pem_key(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    pem = serialization.Encoding.PEM
    write("ca.pem", ca.public_bytes(pem), False)
    write("ca.key", pem_key(ca_key), True)
    write("server.pem", server.public_bytes(pem), False)
    write("server.key", pem_key(server_key), True)
    write("client.pem", client.public_bytes(pem), False)
    write("client.key", pem_key(client_key), True)
    return written


def config_snippet(files: dict[str, Path]) -> str:
    """What to add to a run config, and how trainers use the client certificate."""
    return (f"# add to the run config (mutual TLS; drop verify_client for server-only TLS):\n"
            f"security:\n"
            f"  tls:\n"
            f"    cert: {files['server.pem'].resolve()}\n"
            f"    key: {files['server.key'].resolve()}\n"
            f"    ca: {files['ca.pem'].resolve()}\n"
            f"    verify_client: true\n"
            f"# trainers (TrainerClient / StepFetcher read these), and `overlord inspect --ca/--cert/--key`:\n"
            f"export OVERLORD_TLS_CA={files['ca.pem'].resolve()}\n"
            f"export OVERLORD_TLS_CERT={files['client.pem'].resolve()}\n"
            f"export OVERLORD_TLS_KEY={files['client.key'].resolve()}\n")
