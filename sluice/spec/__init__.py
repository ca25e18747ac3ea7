"""The operator's language: spec models, YAML loading with located errors, revision diffs,
and tenant keys kept only as digests (`redact_secrets`, `resolve_key_sources`)."""

from sluice.spec.diff import revision_diff
from sluice.spec.loader import LoadedSpec, load_spec_file, load_spec_text
from sluice.spec.models import (
    ControlSpec,
    GroupSpec,
    ModelSpec,
    PlatformSpec,
    PoolSpec,
    RetentionSpec,
    RouteSpec,
    TenantSpec,
    key_digest,
)
from sluice.spec.secrets import redact_secrets, resolve_key_sources

__all__ = [
    "ControlSpec",
    "GroupSpec",
    "LoadedSpec",
    "ModelSpec",
    "PlatformSpec",
    "PoolSpec",
    "RetentionSpec",
    "RouteSpec",
    "TenantSpec",
    "key_digest",
    "load_spec_file",
    "load_spec_text",
    "redact_secrets",
    "resolve_key_sources",
    "revision_diff",
]
