"""The live controller: reconcile loop, instance supervision, events, control API."""

from sluice.control.api import build_control_api
from sluice.control.controller import Controller
from sluice.control.events import EventLog
from sluice.control.housekeeping import Housekeeper
from sluice.control.observer import Observer
from sluice.control.review import ReviewBoard
from sluice.control.supervisor import InstanceSupervisor
from sluice.control.tokens import TokenAdmin

__all__ = [
    "Controller",
    "EventLog",
    "Housekeeper",
    "InstanceSupervisor",
    "Observer",
    "ReviewBoard",
    "TokenAdmin",
    "build_control_api",
]
