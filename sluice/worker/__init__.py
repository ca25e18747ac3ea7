"""The program one inference instance runs: an OpenAI-compatible server over its models.

Started by the controller as `python -m sluice.worker --config-json '<WorkerConfig JSON>'`.
Importing this package stays light (no Starlette, uvicorn or torch) so the controller and
tests can build a `WorkerConfig` cheaply.
"""

from sluice.worker.config import WorkerConfig

__all__ = ["WorkerConfig"]
