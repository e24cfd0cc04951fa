"""``flowforge doctor``: is this installation healthy, and if not, what to do about it.

Checks, in order: the cluster answers; the CRDs are installed, Established, and carry the
schema this FlowForge generates; the store answers and its schema version is the one this
FlowForge needs; an operator holds the lease; no run has been silent for too long; the
admission webhook configurations exist, their CA (caBundle) is not expiring, and the
webhook server answers with a certificate that CA signed. Each finding says what to do.
Exit 0 when all checks pass, 1 on findings: an unreachable part is a finding here, not a
failure of the command.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import socket
import ssl
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import psycopg
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from kubernetes import client as k8s

from flowforge.cli.connections import kube_client, store_dsn
from flowforge.cli.output import EXIT_FAILED, EXIT_OK, CommandError, emit, first_line
from flowforge.domain.errors import FlowForgeError
from flowforge.domain.states import RunPhase
from flowforge.kube.crdgen import workflow_definition_crd, workflow_run_crd
from flowforge.kube.errors import KubernetesError, kubernetes_errors
from flowforge.store.connection import Pool
from flowforge.store.lease import current_lease
from flowforge.store.migrate import check_schema
from flowforge.store.pool import open_pool

PROBE_TIMEOUT_SECONDS = 5.0

SILENT_RUNS_QUERY = """
SELECT run.namespace, run.name, coalesce(last.recorded_at, run.created_at) AS last_seen
FROM flowforge_run AS run
LEFT JOIN LATERAL (
    SELECT recorded_at FROM flowforge_event WHERE run_id = run.id ORDER BY id DESC LIMIT 1
) AS last ON true
WHERE run.phase = ANY(%s)
  AND coalesce(last.recorded_at, run.created_at) < now() - %s
ORDER BY last_seen
"""


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    message: str
    advice: str = ""


def run_doctor(args: argparse.Namespace) -> int:
    dsn = store_dsn(args)
    findings = [*_kube_findings(args), *asyncio.run(_store_findings(args, dsn))]
    healthy = all(finding.ok for finding in findings)
    emit(
        args.output,
        data=lambda: {"ok": healthy, "checks": [asdict(finding) for finding in findings]},
        table=lambda _wide: _findings_text(findings),
    )
    return EXIT_OK if healthy else EXIT_FAILED


def _findings_text(findings: list[Finding]) -> str:
    lines = []
    for finding in findings:
        lines.append(f"{'ok  ' if finding.ok else 'FAIL'}  {finding.check:<9} {finding.message}")
        if not finding.ok and finding.advice:
            lines.append(f"      {'':<9} -> {finding.advice}")
    return "".join(f"{line}\n" for line in lines)


# Kubernetes


def _kube_findings(args: argparse.Namespace) -> list[Finding]:
    try:
        api = kube_client(args)
    except CommandError as error:
        return [
            Finding(
                "cluster",
                False,
                str(error),
                "pass --kubeconfig or set KUBECONFIG to the cluster's kubeconfig",
            )
        ]
    with api:
        try:
            with kubernetes_errors():
                version = k8s.VersionApi(api).get_code()
        except (KubernetesError, OSError) as error:
            return [
                Finding(
                    "cluster",
                    False,
                    f"cannot reach {api.configuration.host}: {_short(error)}",
                    "check the kubeconfig and that the API server is "
                    "up (`kubectl cluster-info`); the other cluster checks were skipped",
                )
            ]
        findings = [
            Finding(
                "cluster", True, f"Kubernetes {version.git_version} at {api.configuration.host}"
            )
        ]
        findings.extend(_crd_findings(api))
        findings.extend(_webhook_findings(api, args))
        return findings


def _short(error: BaseException) -> str:
    return first_line(error)[:300]


def _crd_findings(api: k8s.ApiClient) -> list[Finding]:
    extensions = k8s.ApiextensionsV1Api(api)
    findings = []
    for expected in (workflow_definition_crd(), workflow_run_crd()):
        name = expected["metadata"]["name"]
        install = (
            "apply the CRDs of this release: `kubectl apply --server-side -f crds/` "
            "(or `helm upgrade`)"
        )
        try:
            with kubernetes_errors():
                response: Any = extensions.read_custom_resource_definition(
                    name, _preload_content=False
                )
        except KubernetesError as error:
            if not error.not_found:
                raise
            findings.append(Finding("crds", False, f"{name} is not installed", install))
            continue
        installed = json.loads(response.data)
        versions = {v["name"]: v for v in installed["spec"].get("versions", [])}
        problems = []
        for version in expected["spec"]["versions"]:
            have = versions.get(version["name"])
            if have is None:
                problems.append(f"version {version['name']} is not served")
            elif have.get("schema") != version["schema"]:
                problems.append(f"the {version['name']} schema differs from this FlowForge's")
        conditions = installed.get("status", {}).get("conditions") or []
        if not any(
            c.get("type") == "Established" and c.get("status") == "True" for c in conditions
        ):
            problems.append("it is not Established")
        if problems:
            findings.append(Finding("crds", False, f"{name}: {'; '.join(problems)}", install))
        else:
            served = ", ".join(sorted(versions))
            findings.append(Finding("crds", True, f"{name} ({served}) matches this FlowForge"))
    return findings


def _webhook_findings(api: k8s.ApiClient, args: argparse.Namespace) -> list[Finding]:
    admission = k8s.AdmissionregistrationV1Api(api)
    name = args.webhook_configuration
    readers: dict[str, Callable[..., Any]] = {
        "ValidatingWebhookConfiguration": admission.read_validating_webhook_configuration,
        "MutatingWebhookConfiguration": admission.read_mutating_webhook_configuration,
    }
    findings = []
    seen: set[str] = set()  # CAs and endpoints already checked: webhooks share them
    for kind, read in readers.items():
        try:
            with kubernetes_errors():
                configuration = json.loads(read(name, _preload_content=False).data)
        except KubernetesError as error:
            if not error.not_found:
                raise
            findings.append(
                Finding(
                    "webhooks",
                    False,
                    f"{kind} {name} is missing: definitions and runs are not "
                    "validated, and definitions are not published to the store",
                    "restart the operator (it writes its webhook configurations at start) or run "
                    "`helm upgrade`",
                )
            )
            continue
        webhooks = configuration.get("webhooks") or []
        findings.append(Finding("webhooks", True, f"{kind} {name} ({len(webhooks)} webhooks)"))
        for webhook in webhooks:
            findings.extend(
                _certificate_findings(f"{kind} {name}", webhook, seen=seen, api=api, args=args)
            )
    return findings


def _certificate_findings(
    where: str,
    webhook: dict[str, Any],
    *,
    seen: set[str],
    api: k8s.ApiClient,
    args: argparse.Namespace,
) -> list[Finding]:
    client_config = webhook.get("clientConfig") or {}
    rotate = (
        "rotate the webhook certificates (restart the operator, or renew the secret "
        "behind the chart's webhook TLS) and update the caBundle"
    )
    try:
        ca_pem = base64.b64decode(client_config.get("caBundle") or "")
        authorities = x509.load_pem_x509_certificates(ca_pem)
    except ValueError:
        return [
            Finding(
                "webhooks",
                False,
                f"{where}: webhook {webhook.get('name')}: the caBundle holds no PEM certificate",
                rotate,
            )
        ]
    findings = []
    for certificate in authorities:
        fingerprint = certificate.fingerprint(hashes.SHA256()).hex()
        if fingerprint not in seen:
            seen.add(fingerprint)
            findings.append(
                _expiry(
                    "CA",
                    f"{where} caBundle",
                    certificate=certificate,
                    warning=args.cert_warning,
                    advice=rotate,
                )
            )
    url, service = client_config.get("url"), client_config.get("service")
    if url:
        parts = urlsplit(url)
        target = f"{parts.hostname}:{parts.port or 443}"
    else:
        target = json.dumps(service, sort_keys=True)
    if target in seen:
        return findings
    seen.add(target)
    if url:
        findings.append(_probe_url(url, ca_pem=ca_pem, warning=args.cert_warning, advice=rotate))
    elif service:
        findings.append(_probe_service(api, service))
    return findings


def _expiry(
    what: str, where: str, *, certificate: x509.Certificate, warning: timedelta, advice: str
) -> Finding:
    left = certificate.not_valid_after_utc - datetime.now(UTC)
    subject = certificate.subject.rfc4514_string() or "(no subject)"
    if left <= timedelta(0):
        return Finding(
            "webhooks",
            False,
            f"{where}: {what} certificate {subject} expired "
            f"{-left.days} days ago: the apiserver refuses the webhook",
            advice,
        )
    if left < warning:
        return Finding(
            "webhooks",
            False,
            f"{where}: {what} certificate {subject} expires in {left.days} days",
            advice,
        )
    return Finding(
        "webhooks", True, f"{where}: {what} certificate {subject} valid for {left.days} more days"
    )


def _probe_url(url: str, *, ca_pem: bytes, warning: timedelta, advice: str) -> Finding:
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    context = ssl.create_default_context(cadata=ca_pem.decode("ascii", errors="replace"))
    try:
        with (
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_SECONDS) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
    except ssl.SSLCertVerificationError as error:
        return Finding(
            "webhooks",
            False,
            f"the webhook server at {url} presents a certificate "
            f"the caBundle does not verify: {error.verify_message}",
            advice,
        )
    except OSError as error:
        return Finding(
            "webhooks",
            False,
            f"the webhook server at {url} does not answer "
            f"({_short(error)}): with failurePolicy Fail, every WorkflowDefinition "
            "and WorkflowRun write is refused",
            "start the operator's webhook server, "
            "or remove the webhook configurations while it is down",
        )
    serving = x509.load_der_x509_certificate(der or b"")
    return _expiry(
        "serving",
        f"webhook server {host}:{port}",
        certificate=serving,
        warning=warning,
        advice=advice,
    )


def _probe_service(api: k8s.ApiClient, service: dict[str, Any]) -> Finding:
    namespace, name = service.get("namespace", ""), service.get("name", "")
    try:
        with kubernetes_errors():
            response: Any = k8s.CoreV1Api(api).read_namespaced_endpoints(
                name, namespace, _preload_content=False
            )
        subsets = json.loads(response.data).get("subsets") or []
    except KubernetesError as error:
        if not error.not_found:
            raise
        subsets = []
    if any(subset.get("addresses") for subset in subsets):
        return Finding("webhooks", True, f"Service {namespace}/{name} has ready endpoints")
    return Finding(
        "webhooks",
        False,
        f"Service {namespace}/{name} has no ready endpoints: "
        "with failurePolicy Fail, every WorkflowDefinition and WorkflowRun write is "
        "refused",
        f"check the operator's Pods: `kubectl -n {namespace} get pods`",
    )


# the store


async def _store_findings(args: argparse.Namespace, dsn: str) -> list[Finding]:
    try:
        pool = await open_pool(
            dsn, min_size=1, max_size=1, verify_schema=False, name="flowforge-doctor"
        )
    except (psycopg.Error, OSError) as error:
        return [
            Finding(
                "store",
                False,
                f"cannot connect: {_short(error)}",
                "check --dsn / FLOWFORGE_DSN and that PostgreSQL is up; the other "
                "store checks were skipped",
            )
        ]
    try:
        try:
            async with pool.connection() as connection:
                version = await check_schema(connection)
        except FlowForgeError as error:
            return [
                Finding(
                    "store",
                    False,
                    str(error),
                    "run `flowforge db migrate`, or upgrade FlowForge when the schema "
                    "is newer than it knows",
                )
            ]
        findings = [Finding("store", True, f"reachable, schema version {version}")]
        findings.append(await _lease_finding(pool, args.lease))
        findings.append(await _silent_runs_finding(pool, args.stuck_after))
        return findings
    finally:
        await pool.close()


async def _lease_finding(pool: Pool, name: str) -> Finding:
    lease = await current_lease(pool, name)
    if lease is None:
        return Finding(
            "lease",
            False,
            f"no operator has ever held the lease {name!r}",
            "start the operator; check its logs for errors reaching the store",
        )
    left = (lease.expires_at - datetime.now(UTC)).total_seconds()
    if left < 0:
        return Finding(
            "lease",
            False,
            f"the lease {name!r} of {lease.holder} (epoch "
            f"{lease.epoch}) expired {-left:.0f} s ago: no operator is working",
            "check that the operator runs (`kubectl get pods`) and its logs",
        )
    return Finding(
        "lease", True, f"held by {lease.holder} (epoch {lease.epoch}), renewed within {left:.0f} s"
    )


async def _silent_runs_finding(pool: Pool, after: timedelta) -> Finding:
    async with pool.connection() as connection:
        unfinished = [str(RunPhase.PENDING), str(RunPhase.RUNNING)]
        cursor = await connection.execute(SILENT_RUNS_QUERY, (unfinished, after))
        rows = await cursor.fetchall()
    if not rows:
        return Finding("runs", True, f"no running run has been silent for over {_human(after)}")
    now = datetime.now(UTC)
    listed = ", ".join(
        f"{namespace}/{name} ({(now - seen).total_seconds() / 60:.0f} min)"
        for namespace, name, seen in rows[:10]
    )
    more = f" and {len(rows) - 10} more" if len(rows) > 10 else ""
    return Finding(
        "runs",
        False,
        f"{len(rows)} running runs have recorded nothing for over {_human(after)}: {listed}{more}",
        "check the operator's logs and `flowforge describe run RUN`; a run waiting on a "
        "long task is fine (raise --stuck-after)",
    )


def _human(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
