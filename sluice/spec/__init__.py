"""The operator's language: spec models, YAML loading with located errors, revision diffs."""

from sluice.spec.diff import revision_diff
from sluice.spec.loader import LoadedSpec, load_spec_file, load_spec_text
from sluice.spec.models import (
    GroupSpec,
    ModelSpec,
    PlatformSpec,
    PoolSpec,
    RouteSpec,
    TenantSpec,
)

__all__ = [
    "GroupSpec",
    "LoadedSpec",
    "ModelSpec",
    "PlatformSpec",
    "PoolSpec",
    "RouteSpec",
    "TenantSpec",
    "load_spec_file",
    "load_spec_text",
    "revision_diff",
]
