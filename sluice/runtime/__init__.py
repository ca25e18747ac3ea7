"""Where instances run: the Runtime protocol and its implementations."""

from sluice.runtime.base import CommandLaunch, InstanceHandle, LaunchRequest, Placement, Runtime
from sluice.runtime.external import ExternalRuntime
from sluice.runtime.local import LocalRuntime

__all__ = [
    "CommandLaunch",
    "ExternalRuntime",
    "InstanceHandle",
    "LaunchRequest",
    "LocalRuntime",
    "Placement",
    "Runtime",
]
