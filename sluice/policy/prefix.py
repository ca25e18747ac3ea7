"""Prefix-cache-aware instance choice with a load guard (issue 35).

A generative server keeps the KV cache of the prompts it prefilled; a request whose leading
blocks it still holds skips their prefill. So the instance to send a prompt to is the one
most likely to hold its longest prefix, unless that instance is already busier than its
share: a prefix picker without a guard piles a hot system prompt onto one instance and
worsens p99 (the complaint against naive prefix routing in llm-d and SGLang's router).

The rule, per request with leading block hashes `blocks` (a prompt cut into fixed-size
blocks, each hash covering the whole prefix up to its end, as vLLM and Mooncake hash them):

1. **Bound** (consistent hashing with bounded loads, Mirrokni et al. 2018): an instance is
   eligible while its outstanding requests are below `ceil((1 + epsilon) x (total + 1) / n)`
   and below its `max_concurrency`.
2. Among eligible instances, the one with the **longest prefix** in this gateway's
   `PrefixIndex`; ties (no instance holds any block, the usual case for a new prompt) go
   to the highest **rendezvous score of the first block**. Every gateway computes the same
   score without talking to the others, so several gateways send a new prefix to the same
   instance, and an instance that joins or leaves moves only its share of prefixes.
3. No instance eligible: the least loaded.

`PrefixIndex` is this gateway's approximate record of what each instance holds: the blocks it
sent there, each instance's last `blocks_per_instance` of them (LRU), so its memory is bounded
by instances x blocks. It is mutable, one per group, fed by the data plane like `RampHold`.
"""

from __future__ import annotations

import math
import zlib
from collections import OrderedDict
from collections.abc import Container, Mapping, Sequence
from typing import NamedTuple

from sluice.policy.balance import rendezvous_score
from sluice.policy.routing import Endpoint

__all__ = ["DEFAULT_EPSILON", "PrefixIndex", "PrefixPick", "pick_prefix", "prompt_blocks"]

DEFAULT_EPSILON = 1.0
"""How far above the mean load an instance may be and still take a prefix it holds: up to
2x. Outstanding requests count decoding ones, which barely slow a prefill, so the 1.25x
usual for CHWBL sends too many prefixes elsewhere. Measured on the Mooncake trace with 4-16
instances and 1,000-4,000 cached blocks each (`bench/prefix.py`): 1.25x kept 66-85 % of the
fleet bound's hit rate, 1.5x 76-90 %, 2x 82-96 %, and every one of them a p99 time to first
token at or below power of two choices'."""


class PrefixIndex:
    """Which blocks each instance was recently sent, each instance's last
    `blocks_per_instance` (least recently sent dropped first)."""

    def __init__(self, blocks_per_instance: float) -> None:
        """`blocks_per_instance`: math.inf never forgets (the simulator's unbounded cache)."""
        if blocks_per_instance < 1:
            raise ValueError("blocks_per_instance must be at least 1")
        self.blocks_per_instance = blocks_per_instance
        self._held: dict[str, OrderedDict[int, None]] = {}
        self._owners: dict[int, set[str]] = {}

    def matched(self, blocks: Sequence[int], instances: Sequence[str]) -> dict[str, int]:
        """How many leading blocks of `blocks` each of `instances` holds (0 for none): one
        pass over the blocks, stopping where no instance holds the next one."""
        depth = dict.fromkeys(instances, 0)
        alive = list(instances)
        for k, block in enumerate(blocks):
            owners = self._owners.get(block)
            if not owners:
                break
            alive = [i for i in alive if i in owners]
            if not alive:
                break
            for i in alive:
                depth[i] = k + 1
        return depth

    def sent(self, instance: str, blocks: Sequence[int]) -> None:
        """`blocks` went to `instance`: it holds them now, as the most recently used."""
        held = self._held.get(instance)
        if held is None:
            held = self._held[instance] = OrderedDict()
        owners = self._owners
        for block in blocks:
            if block in held:
                held.move_to_end(block)
                continue
            held[block] = None
            owners.setdefault(block, set()).add(instance)
        while len(held) > self.blocks_per_instance:
            old, _ = held.popitem(last=False)
            self._disown(old, instance)

    def forget(self, keep: Container[str]) -> None:
        """Drop what the instances not in `keep` held (they left the group)."""
        for instance in [i for i in self._held if i not in keep]:
            for block in self._held.pop(instance):
                self._disown(block, instance)

    def _disown(self, block: int, instance: str) -> None:
        """`instance` no longer holds `block`; a block nobody holds leaves the index."""
        holders = self._owners.get(block)
        if holders is not None:
            holders.discard(instance)
            if not holders:
                del self._owners[block]

    def __len__(self) -> int:
        return sum(len(h) for h in self._held.values())


def prompt_blocks(payload: object, block_bytes: int, max_blocks: int) -> tuple[int, ...]:
    """The block hashes of an OpenAI-format request's prompt: its chat `messages` rendered in
    order (role and text of each; text parts of a list content) or its `prompt`, cut into
    whole blocks of `block_bytes` bytes, at most `max_blocks`, each hash covering the prefix
    up to its end (so equal hashes mean equal prefixes). A partial last block is not hashed:
    servers cache whole blocks only. `()` for anything else, or a prompt under one block.
    The hash is crc32 and adler32 of the prefix, chained block to block (64 bits, no seed:
    every gateway computes the same; 4x cheaper than blake2b, and a collision only costs a
    cache miss). Only the bytes hashed are encoded."""
    if not isinstance(payload, dict):
        return ()
    limit = block_bytes * max_blocks
    parts: list[bytes] = []
    size = 0
    messages = payload.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if size >= limit or not isinstance(m, dict):
                break
            role = m.get("role")
            text = _text(m.get("content"))[: limit - size]  # a char is at least a byte
            piece = f"{role if isinstance(role, str) else ''}\x1e{text}\x1f".encode()
            parts.append(piece)
            size += len(piece)
    else:
        prompt = payload.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            parts.append(prompt[:limit].encode())
    data = b"".join(parts)
    out: list[int] = []
    crc = adler = 1
    view = memoryview(data)
    for start in range(0, min(len(data), limit) - block_bytes + 1, block_bytes):
        block = view[start : start + block_bytes]
        crc = zlib.crc32(block, crc)
        adler = zlib.adler32(block, adler)
        out.append(crc << 32 | adler)
    return tuple(out)


def _text(content: object) -> str:
    """A message's text: a string, or the `text` of each part of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


class PrefixPick(NamedTuple):
    endpoint: Endpoint
    cached: int
    """leading blocks the index says the instance holds (what the gateway expects to hit)"""


def pick_prefix(
    candidates: Sequence[Endpoint],
    blocks: Sequence[int],
    outstanding: Mapping[str, int],
    index: PrefixIndex | None,
    epsilon: float = DEFAULT_EPSILON,
    skip: Container[str] = (),
) -> PrefixPick | None:
    """The instance for a request whose prompt's leading block hashes are `blocks` (module
    docstring). `index` None: rendezvous with bounded loads alone. None if every candidate
    is skipped; a prompt with no block goes to the least loaded."""
    pool = [ep for ep in candidates if ep.instance_id not in skip] if skip else list(candidates)
    if not pool:
        return None
    loads = [outstanding.get(ep.instance_id, 0) for ep in pool]
    least = pool[min(range(len(pool)), key=loads.__getitem__)]
    if not blocks:
        return PrefixPick(least, 0)
    bound = math.ceil((1.0 + epsilon) * (sum(loads) + 1) / len(pool))
    depth = index.matched(blocks, [ep.instance_id for ep in pool]) if index is not None else {}
    first = blocks[0]
    best: Endpoint | None = None
    best_key = (-1, -1)
    for ep, load in zip(pool, loads, strict=True):
        if load >= bound or load >= ep.max_concurrency:
            continue
        key = (depth.get(ep.instance_id, 0), rendezvous_score(ep.instance_id, first))
        if key > best_key:
            best, best_key = ep, key
    if best is None:
        return PrefixPick(least, depth.get(least.instance_id, 0))
    return PrefixPick(best, best_key[0])
