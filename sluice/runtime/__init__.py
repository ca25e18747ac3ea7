"""Where instances run: the Runtime protocol and its implementations."""

from sluice.runtime.base import InstanceHandle, LaunchRequest, Runtime
from sluice.runtime.local import LocalRuntime

__all__ = ["InstanceHandle", "LaunchRequest", "LocalRuntime", "Runtime"]
