"""The operator's language: spec models, YAML loading with located errors, revision diffs,
tenant keys kept only as digests (`redact_secrets`, `resolve_key_sources`), and the memory
estimate that refuses a model too big for its accelerators (`estimate_memory`, G2)."""

from sluice.spec.diff import revision_diff
from sluice.spec.hfconfig import ModelConfigError
from sluice.spec.loader import LoadedSpec, load_spec_file, load_spec_text
from sluice.spec.memory import MemoryEstimate, PoolFit, estimate_memory, pool_fits
from sluice.spec.modeldir import ModelDir, read_model_dir
from sluice.spec.models import (
    ControlSpec,
    GroupSpec,
    InstancesSpec,
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
    "InstancesSpec",
    "LoadedSpec",
    "MemoryEstimate",
    "ModelConfigError",
    "ModelDir",
    "ModelSpec",
    "PlatformSpec",
    "PoolFit",
    "PoolSpec",
    "RetentionSpec",
    "RouteSpec",
    "TenantSpec",
    "estimate_memory",
    "key_digest",
    "load_spec_file",
    "load_spec_text",
    "pool_fits",
    "read_model_dir",
    "redact_secrets",
    "resolve_key_sources",
    "revision_diff",
]
