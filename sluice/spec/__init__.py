"""The operator's language: spec models, YAML loading with located errors, revision diffs,
tenant keys kept only as digests and sealed at rest with webhook URLs (`seal_secrets`,
`open_revision`, `resolve_key_sources`), and the memory
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
from sluice.spec.revision import (
    MAX_SPEC_BYTES,
    RevisionDraft,
    draft_revision,
    open_revision,
    parse_spec,
)
from sluice.spec.sealing import Sealer
from sluice.spec.secrets import redact_secrets, resolve_key_sources, seal_secrets

__all__ = [
    "MAX_SPEC_BYTES",
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
    "RevisionDraft",
    "RouteSpec",
    "Sealer",
    "TenantSpec",
    "draft_revision",
    "estimate_memory",
    "key_digest",
    "load_spec_file",
    "load_spec_text",
    "open_revision",
    "parse_spec",
    "pool_fits",
    "read_model_dir",
    "redact_secrets",
    "resolve_key_sources",
    "revision_diff",
    "seal_secrets",
]
