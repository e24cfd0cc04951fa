"""Throw-away certificate authorities for local webhooks: serving and client certificates.

For tests and `make dev` the apiserver calls the webhook at https://127.0.0.1:<port>, so the
serving certificate carries 127.0.0.1 (and localhost) as subject alternative names and is signed
by a CA whose PEM goes into the webhook configuration's caBundle. The local apiserver presents
a client certificate of another CA to webhooks (its AdmissionConfiguration), and the webhook
server trusts only that CA.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Self

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT_FILE = "ca.crt"
SERVING_CERT_FILE = "tls.crt"
SERVING_KEY_FILE = "tls.key"
CLIENT_CA_CERT_FILE = "client-ca.crt"
CLIENT_CERT_FILE = "client.crt"
CLIENT_KEY_FILE = "client.key"


@dataclass(frozen=True)
class _Files:
    """A CA certificate and a certificate with its key, as files in one directory."""

    ca_cert_path: Path
    cert_path: Path
    key_path: Path

    NAMES: ClassVar[tuple[str, str, str]] = (CA_CERT_FILE, SERVING_CERT_FILE, SERVING_KEY_FILE)

    @property
    def ca_pem(self) -> bytes:
        return self.ca_cert_path.read_bytes()

    @classmethod
    def in_directory(cls, directory: Path) -> Self:
        ca, cert, key = cls.NAMES
        return cls(
            ca_cert_path=directory / ca, cert_path=directory / cert, key_path=directory / key
        )


class WebhookCertificates(_Files):
    """Paths of the generated serving files; `ca_pem` is what a caBundle needs."""


class ClientCertificates(_Files):
    """A CA and the client certificate it signed: the apiserver presents the certificate to
    the webhooks, which trust only that CA."""

    NAMES = (CLIENT_CA_CERT_FILE, CLIENT_CERT_FILE, CLIENT_KEY_FILE)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "FlowForge local development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


@dataclass(frozen=True)
class _Authority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


def _validity(valid_days: int) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=valid_days)


def _new_authority(common_name: str, *, valid_days: int) -> _Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    not_before, not_after = _validity(valid_days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _Authority(key=key, cert=cert)


def _issue(
    authority: _Authority,
    *,
    common_name: str,
    usage: x509.ObjectIdentifier,
    alt_names: list[x509.GeneralName],
    valid_days: int,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    not_before, not_after = _validity(valid_days)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(authority.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()),
            critical=False,
        )
    )
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return builder.sign(authority.key, hashes.SHA256()), key


def _write(
    *,
    ca: x509.Certificate,
    cert: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    paths: _Files,
) -> None:
    paths.ca_cert_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths.key_path.touch(mode=0o600)
    paths.key_path.write_bytes(
        key.private_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PrivateFormat.PKCS8,
            encryption_algorithm=serialization.NoEncryption(),
        )
    )


def generate_webhook_certificates(
    directory: Path,
    *,
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
    valid_days: int = 30,
) -> WebhookCertificates:
    """Write a new CA and a serving certificate for `hosts` into `directory`.

    `hosts` entries that parse as IP addresses become IP SANs, the rest DNS SANs (so the
    in-cluster form `flowforge-webhook.flowforge.svc` works too).
    """
    directory.mkdir(parents=True, exist_ok=True)
    authority = _new_authority("FlowForge webhook CA", valid_days=valid_days)
    alt_names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt_names.append(x509.DNSName(host))
    cert, key = _issue(
        authority,
        common_name=hosts[0],
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        alt_names=alt_names,
        valid_days=valid_days,
    )
    files = WebhookCertificates.in_directory(directory)
    _write(ca=authority.cert, cert=cert, key=key, paths=files)
    return files


def generate_client_certificates(
    directory: Path, *, common_name: str = "kube-apiserver-webhook-client", valid_days: int = 30
) -> ClientCertificates:
    """Write a new CA and a client certificate (TLS client auth only) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    authority = _new_authority("FlowForge webhook client CA", valid_days=valid_days)
    cert, key = _issue(
        authority,
        common_name=common_name,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        alt_names=[],
        valid_days=valid_days,
    )
    files = ClientCertificates.in_directory(directory)
    _write(ca=authority.cert, cert=cert, key=key, paths=files)
    return files
