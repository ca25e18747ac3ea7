"""How the control plane runs: where its API listens (and who must review which changes),
how control planes on one database elect their leader, and where instances run."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sluice.spec.names import Name

__all__ = [
    "ControlSpec",
    "InstancesSpec",
    "LeaderElectionSpec",
    "RaySpec",
    "ReviewSpec",
    "TlsSpec",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ReviewSpec(_Strict):
    """R5: which changes need a second person (`sluice propose` then `sluice approve`)."""

    routes: bool = Field(
        default=False,
        description="routes, tenants and rollouts change only through an approved proposal",
    )


class TlsSpec(_Strict):
    """A certificate and its key (PEM files on the controller's machine), by absolute path
    (like every `*_file` of the spec: not relative to wherever Sluice was started)."""

    cert_file: str = Field(min_length=1, description="absolute path of the PEM certificate")
    key_file: str = Field(min_length=1, description="absolute path of the PEM private key")

    @field_validator("cert_file", "key_file")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/") or "\0" in path:
            raise ValueError(
                "must be an absolute path (e.g. /etc/sluice/tls/tls.crt): the file is read "
                "on the controller's machine, not relative to where Sluice was started"
            )
        return path


class LeaderElectionSpec(_Strict):
    """Control planes on one database elect one leader through a lease row
    (`sluice.policy.lease`; Kubernetes' defaults). A standby takes over within
    `lease_duration_s + retry_period_s` of the leader's death, at once after a clean stop."""

    lease_duration_s: float = Field(default=15.0, gt=0, le=600)
    renew_deadline_s: float = Field(default=10.0, gt=0, le=600)
    retry_period_s: float = Field(default=2.0, gt=0, le=60)

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElectionSpec:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "needs retry_period_s < renew_deadline_s < lease_duration_s: a leader must "
                "stop acting before its lease can be taken"
            )
        return self


class ControlSpec(_Strict):
    """Where the control API listens. Off loopback it needs `tls` (or `sluice up
    --insecure`); a request whose `Host` is not this host, a loopback name or one of
    `allowed_hosts` is refused (DNS rebinding)."""

    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535, description="0: any free port")
    tls: TlsSpec | None = None
    allowed_hosts: list[str] = Field(
        default_factory=list, description="other names clients use, e.g. sluice.corp.example"
    )
    review: ReviewSpec = ReviewSpec()
    leader_election: LeaderElectionSpec = LeaderElectionSpec()


class RaySpec(_Strict):
    """How Sluice reaches its Ray cluster."""

    address: str = Field(
        default="auto",
        min_length=1,
        max_length=512,
        description="'auto': the cluster this machine is a node of; 'host:port': the head's "
        "GCS; 'ray://host:10001': through Ray Client (e.g. a KubeRay head service)",
    )
    namespace: Name = Field(
        default="sluice",
        description="Ray namespace of the instances' actors (each named by its instance id), "
        "so a restarted Sluice finds and adopts them; one per Sluice installation",
    )


class InstancesSpec(_Strict):
    """Where instances run; read when `sluice up` starts (a change takes effect at the
    next start)."""

    runtime: Literal["local", "ray"] = Field(
        default="local",
        description="local: subprocesses of Sluice on this machine; ray: one actor per "
        "instance on a Ray cluster, holding its group's accelerators",
    )
    ray: RaySpec = RaySpec()
