"""A throw-away certificate authority and serving certificate for local webhooks.

For tests and `make dev` the apiserver calls the webhook at https://127.0.0.1:<port>, so the
serving certificate carries 127.0.0.1 (and localhost) as subject alternative names and is signed
by a CA whose PEM goes into the webhook configuration's caBundle.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT_FILE = "ca.crt"
SERVING_CERT_FILE = "tls.crt"
SERVING_KEY_FILE = "tls.key"


@dataclass(frozen=True)
class WebhookCertificates:
    """Paths of the generated files; `ca_pem` is what a caBundle needs."""

    ca_cert_path: Path
    cert_path: Path
    key_path: Path

    @property
    def ca_pem(self) -> bytes:
        return self.ca_cert_path.read_bytes()

    @classmethod
    def in_directory(cls, directory: Path) -> WebhookCertificates:
        return cls(
            ca_cert_path=directory / CA_CERT_FILE,
            cert_path=directory / SERVING_CERT_FILE,
            key_path=directory / SERVING_KEY_FILE,
        )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "FlowForge local development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
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
    now = datetime.datetime.now(datetime.UTC)
    not_before = now - datetime.timedelta(minutes=5)
    not_after = now + datetime.timedelta(days=valid_days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("FlowForge webhook CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
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
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    alt_names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt_names.append(x509.DNSName(host))

    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_name)
        .public_key(serving_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    files = WebhookCertificates.in_directory(directory)
    files.ca_cert_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert_path.write_bytes(serving_cert.public_bytes(serialization.Encoding.PEM))
    files.key_path.touch(mode=0o600)
    files.key_path.write_bytes(
        serving_key.private_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PrivateFormat.PKCS8,
            encryption_algorithm=serialization.NoEncryption(),
        )
    )
    return files
