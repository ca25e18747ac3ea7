"""Trace-driven simulator: the real policy code against simulated instances and a virtual clock."""
