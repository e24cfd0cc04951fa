"""Shared pytest configuration: the real PostgreSQL and Kubernetes fixtures live in
plugin modules so that every test folder can use them."""

pytest_plugins: list[str] = [
    "tests.plugins.kube_cluster",
    "tests.plugins.postgres",
    "tests.plugins.webhooks",
    "tests.plugins.operator",
    "tests.plugins.api_server",
    "tests.plugins.kueue",
]
