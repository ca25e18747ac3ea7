"""A spec text made into a revision: size-checked, its secrets sealed (plain keys made digests,
then digests and webhook URLs sealed with the installation's key: what the store keeps),
parsed and diffed against the previous one; and a stored revision opened and parsed again.
Pure and picklable, so the controller runs them in its spec worker process
(`sluice.control.spec_work`), off the loop."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.core import SpecError, SpecIssue
from sluice.spec.diff import revision_diff
from sluice.spec.loader import LoadedSpec, load_spec_text
from sluice.spec.models import PlatformSpec
from sluice.spec.sealing import Sealer
from sluice.spec.secrets import open_secrets, seal_secrets

__all__ = ["MAX_SPEC_BYTES", "RevisionDraft", "draft_revision", "open_revision", "parse_spec"]

MAX_SPEC_BYTES = 2 << 20
"""A real platform spec is kilobytes (the examples are 2-7 KB; a thousand groups with
comments stay under 1 MB). 2 MiB leaves room for that and refuses what would cost the
controller seconds a megabyte to check (about 5 s here) and be kept in every revision."""


@dataclass(frozen=True, slots=True)
class RevisionDraft:
    text: str
    """as the store keeps it: tenant keys and webhook URLs sealed (`seal_secrets`)"""
    loaded: LoadedSpec
    """`text` opened (keys as digests, webhooks as URLs), parsed and checked"""
    diff: str
    """unified diff against the previous revision's text"""
    previous: PlatformSpec | None
    """the previous revision's spec, when asked for (a proposal's preview compares them)"""


def parse_spec(text: str, source: str) -> LoadedSpec:
    """`load_spec_text`, refusing a text over `MAX_SPEC_BYTES` first."""
    _check_size(text, source)
    return load_spec_text(text, source)


def _check_size(text: str, source: str) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:
        why = f"the spec is {size} bytes; at most {MAX_SPEC_BYTES} (split it, or drop comments)"
        raise SpecError([SpecIssue("", why, source)])


def open_revision(text: str, source: str, sealer: Sealer) -> LoadedSpec:
    """A stored revision (or proposal) parsed with its secrets opened."""
    return load_spec_text(open_secrets(text, source, sealer), source)


def draft_revision(
    text: str,
    source: str,
    previous: str | None,
    number: int,
    sealer: Sealer,
    *,
    parse_previous: bool = False,
) -> RevisionDraft:
    """Revision `number` made of `text` (its diff against `previous`, the text of revision
    `number - 1`, or None for the first); `parse_previous`: parse that one too."""
    _check_size(text, source)
    stored = seal_secrets(text, source, sealer)  # every line stays: errors stay located
    loaded = open_revision(stored, source, sealer)
    diff = revision_diff(previous, stored, number) if previous != stored else ""
    before = None
    if parse_previous and previous is not None:
        before = open_revision(previous, f"revision {number - 1}", sealer).spec
    return RevisionDraft(stored, loaded, diff, before)
