"""Sluice: one endpoint in front of many isolated inference instance groups."""

__version__ = "0.1.0"
