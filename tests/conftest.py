"""Fixtures shared by every test level."""

from __future__ import annotations

import pytest

from tests.tiny_lm import TinyLM, build_tiny_lm


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> TinyLM:
    """A tiny random GPT-2 and tokenizer saved as model directories (see tests/tiny_lm.py);
    built once per session, offline, in about a second after torch is imported."""
    return build_tiny_lm(tmp_path_factory.mktemp("tiny-lm"))
