"""The live controller: reconcile loop, instance supervision, events, control API."""

from sluice.control.api import build_control_api
from sluice.control.controller import Controller
from sluice.control.events import EventLog
from sluice.control.supervisor import InstanceSupervisor

__all__ = ["Controller", "EventLog", "InstanceSupervisor", "build_control_api"]
