"""Kubernetes' grammars for names and values, as patterns Go, Rust and Python read alike.

One place for them: the hand-written schema (`spec_schema`), the generator of the Pod-spec
schema (`flowforge.kube.podspec_gen`) and the template rules (`template_rules`) use these.
"""

from __future__ import annotations

import re
from typing import Final

DNS1123_LABEL_PATTERN: Final = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN_PATTERN: Final = (
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
LABEL_VALUE_PATTERN: Final = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# printable ASCII but '=' (RelaxedEnvironmentVariableValidation, on since 1.32)
ENV_NAME_PATTERN: Final = "^[ -<>-~]+$"
NON_BLANK_PATTERN: Final = "^\\S(.*\\S)?$"
# resource.Quantity: a signed decimal, then a binary or decimal SI suffix or an exponent
QUANTITY_PATTERN: Final = (
    "^[+-]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)

PATTERN_DESCRIPTIONS: Final[dict[str, str]] = {
    DNS1123_LABEL_PATTERN: (
        "a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a "
        "letter or digit)"
    ),
    DNS1123_SUBDOMAIN_PATTERN: "a DNS-1123 subdomain (DNS-1123 labels joined by '.')",
    LABEL_VALUE_PATTERN: (
        "a label value (at most 63 letters, digits, '-', '_' or '.', starting and ending with "
        "a letter or digit)"
    ),
    ENV_NAME_PATTERN: "an environment variable name (printable ASCII characters other than '=')",
    NON_BLANK_PATTERN: "a value without leading or trailing whitespace",
    QUANTITY_PATTERN: "a quantity such as 500m, 2, 1.5Gi or 1e3",
}

_QUALIFIED_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_SUBDOMAIN: Final = re.compile(DNS1123_SUBDOMAIN_PATTERN.removesuffix("$") + r"\Z")


def qualified_name_problem(key: str) -> str | None:
    """Why ``key`` is no label or annotation key (``[prefix/]name``), or None when it is."""
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return "has an empty prefix before '/'"
    if prefix and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        return (
            f"has prefix {prefix[:60]!r}, which is no DNS-1123 subdomain of at most 253 characters"
        )
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return (
            "is no qualified name (at most 63 letters, digits, '-', '_' or '.', starting and "
            "ending with a letter or digit, optionally after a DNS subdomain prefix and '/')"
        )
    return None
