"""The web console: the operator's view of the fleet, behind the control API's tokens."""

from sluice.control.console.routes import is_console_path, mount_console

__all__ = ["is_console_path", "mount_console"]
