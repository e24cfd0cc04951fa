"""Shared pytest configuration: the real PostgreSQL and Kubernetes fixtures live in
plugin modules so that every test folder can use them.

Hypothesis' timing checks (a draw's or an example's wall time) judge the machine, not the
code: our machines are shared and `make test` runs two workers, so they are off for every
property test; the number of examples and the shrinking stay as each test sets them.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("flowforge", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("flowforge")

pytest_plugins: list[str] = [
    "tests.plugins.kube_cluster",
    "tests.plugins.postgres",
    "tests.plugins.webhooks",
    "tests.plugins.operator",
    "tests.plugins.api_server",
    "tests.plugins.kueue",
    "tests.plugins.helm",
]
