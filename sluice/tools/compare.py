"""`sluice compare`: send one fixed suite of requests to two targets (old and new version) and
report how their answers differ, item by item and in aggregate (requirement C5).

The suite is JSONL, one OpenAI request body per line: chat (`messages`), text completion
(`prompt`) or embeddings (`input`); an optional `id` names the item and is not sent. Bodies
go out otherwise unchanged, so a suite pins temperature and the like itself. A target is
`group:NAME` (through the gateway, header `x-sluice-group`, operator tenants only) or a base
URL `http://host:port` (one instance, no gateway).

The engine is an async shell (httpx, bounded concurrency per target) around pure functions:
`read_answer` (response -> Answer), `score_item` and `summarise`. The result is one JSON
document that is archived with a rollout, so its shape is versioned (`schema`) and only ever
grows. Version "sluice.compare/1":

    schema          "sluice.compare/1"
    suite           {path, sha256 (of the file's bytes), items}
    a, b            {target (as given), url, group (or null)}
    started_at      unix seconds;  duration_s
    summary
      items, compared (both sides answered 2xx), kinds {chat, completion, embedding: count}
      status        {a: {"200": n, "500": n, "error": n (no HTTP answer)}, b: {...}}
      errors        {a: n, b: n}  (items whose side did not answer 2xx)
      exact_match_rate          share of compared items whose outputs are equal (null if none)
      text          (generation items) {compared, exact_match_rate,
                    similarity {mean, median, min}, jaccard {mean, median, min},
                    output_tokens {a: dist, b: dist}, output_chars {a: dist, b: dist},
                    length_ks {statistic, p_value} (two-sample KS on output_tokens; null
                    when a side has none), finish_reason {a: {reason: n}, b: {...}},
                    empty_rate {a, b}, style {a: st, b: st}}
      embedding     (embedding items) {compared, cosine {mean, median, min}}
      latency_s     {a: dist, b: dist} over 2xx answers
    worst           the N compared items with the lowest similarity (text: SequenceMatcher
                    ratio; embeddings: mean cosine), lowest first, as in `items`
    items           per item, in suite order: {index, line, id, kind, exact, similarity,
                    jaccard, cosine, a: side, b: side}
      side          {status (null: no HTTP answer), latency_s, output_tokens, chars,
                    finish_reason, version (x-sluice-model-version, else from the
                    system_fingerprint "MODEL:VERSION"), text (null for
                    embeddings), error (null when 2xx)}

`dist` is {count, mean, min, p50, p95, max}; `st` is the mean of policy.analysis'
style_features over a side's outputs: {words_per_sentence, type_token_ratio,
markup_density, refusal_rate}. Similarity fields are null where they do not
apply (cosine for text, jaccard for embeddings, every score when a side failed).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import statistics
import struct
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from sluice.core.errors import SpecError, SpecIssue, Unavailable
from sluice.policy.analysis import style_features
from sluice.policy.evidence import ks_test
from sluice.tools.scoring import cosine, distribution, jaccard, sequence_ratio

__all__ = [
    "SCHEMA",
    "Answer",
    "CompareOptions",
    "SuiteItem",
    "Target",
    "compare",
    "load_suite",
    "parse_target",
    "read_answer",
    "score_item",
    "summarise",
]

SCHEMA = "sluice.compare/1"
Kind = Literal["chat", "completion", "embedding"]
_PATHS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "embedding": "/v1/embeddings",
}
_KIND_KEYS: tuple[tuple[Kind, str], ...] = (
    ("chat", "messages"),
    ("completion", "prompt"),
    ("embedding", "input"),
)
_MAX_ISSUES = 20
"""A suite with more bad lines than this is probably not JSONL at all; stop listing."""


@dataclass(frozen=True, slots=True)
class SuiteItem:
    index: int
    line: int
    id: str
    kind: Kind
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Target:
    spec: str
    """As the operator wrote it: `group:NAME` or a base URL."""
    url: str
    group: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"target": self.spec, "url": self.url, "group": self.group}


@dataclass(frozen=True, slots=True)
class CompareOptions:
    api_key: str | None = None
    concurrency: int = 4
    """In-flight requests per target."""
    timeout_s: float = 120.0
    worst: int = 10


@dataclass(frozen=True, slots=True)
class Answer:
    """One side's answer to one item."""

    status: int | None
    """HTTP status; None when no HTTP answer came (refused, timed out)."""
    latency_s: float
    text: str | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    vectors: tuple[tuple[float, ...], ...] | None = None
    version: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status is not None and 200 <= self.status < 300


# --- the suite and the targets -------------------------------------------------------------


def load_suite(path: Path) -> list[SuiteItem]:
    """Parse a JSONL suite; every bad line becomes a SpecIssue naming file and line (exit 2)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(
            [SpecIssue("--suite", f"cannot read the suite: {exc}", str(path))]
        ) from None
    items: list[SuiteItem] = []
    issues: list[SpecIssue] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or len(issues) >= _MAX_ISSUES:
            continue
        item, problem = _parse_line(raw, number, len(items))
        if problem is not None:
            issues.append(SpecIssue(problem[0], problem[1], str(path), number))
        elif item is not None:
            if item.id in seen:
                message = f"duplicate id {item.id!r} (first on line {seen[item.id]})"
                issues.append(SpecIssue("id", message, str(path), number))
            seen.setdefault(item.id, number)
            items.append(item)
    if not items and not issues:
        issues.append(
            SpecIssue("", "the suite has no requests (one JSON body per line)", str(path))
        )
    if issues:
        raise SpecError(issues)
    return items


def _parse_line(
    raw: str, number: int, index: int
) -> tuple[SuiteItem | None, tuple[str, str] | None]:
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        return None, ("", f"not valid JSON: {exc.msg} (column {exc.colno})")
    if not isinstance(body, dict):
        return None, ("", "each line must be a JSON object (one OpenAI request body)")
    if not isinstance(body.get("model"), str) or not body["model"]:
        return None, ("model", "a model id (string) is required")
    kinds = [kind for kind, key in _KIND_KEYS if key in body]
    if len(kinds) != 1:
        return None, ("", "give exactly one of 'messages' (chat), 'prompt' or 'input' (embed)")
    if kinds[0] == "chat" and (not isinstance(body["messages"], list) or not body["messages"]):
        return None, ("messages", "must be a non-empty list of messages")
    if body.get("stream"):
        return None, ("stream", "compare reads whole answers; remove 'stream'")
    raw_id = body.pop("id", None)
    if raw_id is not None and not isinstance(raw_id, str | int):
        return None, ("id", "must be a string or a number")
    item_id = str(raw_id) if raw_id is not None else f"line-{number}"
    return SuiteItem(index, number, item_id, kinds[0], body), None


def parse_target(text: str, option: str, endpoint: str | None) -> Target:
    """`group:NAME` (needs the gateway `endpoint`) or `http(s)://host:port` (an instance)."""
    if text.startswith("group:"):
        group = text.removeprefix("group:").strip()
        if not group:
            raise SpecError([SpecIssue(option, "group:NAME needs a group name", "<command line>")])
        if endpoint is None:
            raise Unavailable(
                f"{option} {text}: no gateway endpoint; pass --endpoint URL or start sluice "
                "(`sluice up -f SPEC`) so control.json names it"
            )
        return Target(text, endpoint.rstrip("/"), group)
    if text.startswith(("http://", "https://")):
        return Target(text, text.rstrip("/").removesuffix("/v1"))
    message = f"{text!r}: expected group:NAME or a base URL such as http://127.0.0.1:8001"
    raise SpecError([SpecIssue(option, message, "<command line>")])


# --- reading answers (pure) ----------------------------------------------------------------


def read_answer(
    kind: Kind, status: int, body: Any, latency_s: float, version: str | None
) -> Answer:
    """Turn one HTTP answer into an Answer; a 2xx body that does not parse is an error too."""
    if not 200 <= status < 300:
        return Answer(status, latency_s, version=version, error=_error_message(status, body))
    try:
        if kind == "embedding":
            data = sorted(body["data"], key=lambda d: d["index"])
            vectors = tuple(_vector(d["embedding"]) for d in data)
            return Answer(status, latency_s, vectors=vectors, version=version)
        choice = body["choices"][0]
        text = choice["message"]["content"] if kind == "chat" else choice["text"]
        usage = body.get("usage") or {}
        tokens = usage.get("completion_tokens")
        return Answer(
            status,
            latency_s,
            text=text or "",
            output_tokens=int(tokens) if tokens is not None else len((text or "").split()),
            finish_reason=choice.get("finish_reason"),
            version=version,
        )
    except (KeyError, IndexError, TypeError, ValueError, struct.error) as exc:
        return Answer(status, latency_s, version=version, error=f"unreadable answer: {exc!r}")


def _vector(raw: Any) -> tuple[float, ...]:
    if isinstance(raw, str):  # encoding_format: base64, little-endian float32
        packed = base64.b64decode(raw)
        return struct.unpack(f"<{len(packed) // 4}f", packed)
    return tuple(float(x) for x in raw)


def _error_message(status: int, body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message") or body["error"])
    return f"HTTP {status}: {str(body)[:200]}"


# --- scoring (pure) ------------------------------------------------------------------------


def _side(answer: Answer) -> dict[str, Any]:
    return {
        "status": answer.status,
        "latency_s": round(answer.latency_s, 6),
        "output_tokens": answer.output_tokens,
        "chars": None if answer.text is None else len(answer.text),
        "finish_reason": answer.finish_reason,
        "version": answer.version,
        "text": answer.text,
        "error": answer.error,
    }


def score_item(item: SuiteItem, a: Answer, b: Answer) -> dict[str, Any]:
    """One row of `items`: exactness and similarity of the two answers, and both sides."""
    exact: bool | None = None
    similarity = jac = cos = None
    if a.ok and b.ok:
        if item.kind == "embedding":
            left_v, right_v = a.vectors or (), b.vectors or ()
            if left_v and len(left_v) == len(right_v):
                cos = statistics.fmean(cosine(x, y) for x, y in zip(left_v, right_v, strict=True))
                exact = all(_same_vector(x, y) for x, y in zip(left_v, right_v, strict=True))
            else:
                cos, exact = 0.0, False
            similarity = cos
        else:
            left, right = a.text or "", b.text or ""
            exact = left == right
            similarity = sequence_ratio(left, right)
            jac = jaccard(left, right)
    return {
        "index": item.index,
        "line": item.line,
        "id": item.id,
        "kind": item.kind,
        "exact": exact,
        "similarity": similarity,
        "jaccard": jac,
        "cosine": cos,
        "a": _side(a),
        "b": _side(b),
    }


def _same_vector(x: Sequence[float], y: Sequence[float]) -> bool:
    """Equal up to float32 round-off (1e-6): what "exact" means for embeddings."""
    return len(x) == len(y) and all(abs(p - q) <= 1e-6 for p, q in zip(x, y, strict=True))


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, "min": None}
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "min": min(values),
    }


def _style(texts: Sequence[str]) -> dict[str, float | None]:
    """Means of the live analysis' style features over one side's outputs."""
    names = ("words_per_sentence", "type_token_ratio", "markup_density", "refusal_rate")
    if not texts:
        return dict.fromkeys(names)
    columns = zip(*(style_features(text) for text in texts), strict=True)
    return {name: statistics.fmean(column) for name, column in zip(names, columns, strict=True)}


def _rate(hits: int, total: int) -> float | None:
    return None if total == 0 else hits / total


def summarise(rows: Sequence[dict[str, Any]], worst: int) -> dict[str, Any]:
    """The `summary` and `worst` parts of the report from the scored `items` rows."""
    compared = [r for r in rows if r["exact"] is not None]
    text = [r for r in compared if r["kind"] != "embedding"]
    embedded = [r for r in compared if r["kind"] == "embedding"]

    def side_values(side: str, key: str, pool: Sequence[dict[str, Any]]) -> list[float]:
        return [r[side][key] for r in pool if r[side][key] is not None]

    def per_side(fn: Any) -> dict[str, Any]:
        return {side: fn(side) for side in ("a", "b")}

    generated = [r for r in rows if r["kind"] != "embedding"]
    answered = {side: [r for r in generated if r[side]["error"] is None] for side in ("a", "b")}
    tokens = per_side(lambda s: side_values(s, "output_tokens", answered[s]))
    ks = ks_test(tokens["a"], tokens["b"]) if tokens["a"] and tokens["b"] else None
    summary = {
        "items": len(rows),
        "compared": len(compared),
        "kinds": dict(Counter(r["kind"] for r in rows)),
        "status": per_side(
            lambda s: dict(
                Counter("error" if r[s]["status"] is None else str(r[s]["status"]) for r in rows)
            )
        ),
        "errors": per_side(lambda s: sum(1 for r in rows if r[s]["error"] is not None)),
        "exact_match_rate": _rate(sum(1 for r in compared if r["exact"]), len(compared)),
        "text": {
            "compared": len(text),
            "exact_match_rate": _rate(sum(1 for r in text if r["exact"]), len(text)),
            "similarity": _spread([r["similarity"] for r in text]),
            "jaccard": _spread([r["jaccard"] for r in text]),
            "output_tokens": per_side(lambda s: distribution(tokens[s])),
            "output_chars": per_side(lambda s: distribution(side_values(s, "chars", answered[s]))),
            "length_ks": None if ks is None else {"statistic": ks[0], "p_value": ks[1]},
            "finish_reason": per_side(
                lambda s: dict(Counter(str(r[s]["finish_reason"]) for r in answered[s]))
            ),
            "empty_rate": per_side(
                lambda s: _rate(sum(1 for r in answered[s] if not r[s]["text"]), len(answered[s]))
            ),
            "style": per_side(lambda s: _style([r[s]["text"] or "" for r in answered[s]])),
        },
        "embedding": {
            "compared": len(embedded),
            "cosine": _spread([r["cosine"] for r in embedded]),
        },
        "latency_s": per_side(
            lambda s: distribution([r[s]["latency_s"] for r in rows if r[s]["error"] is None])
        ),
    }
    ranked = sorted(compared, key=lambda r: (r["similarity"], r["index"]))
    return {"summary": summary, "worst": ranked[: max(0, worst)]}


# --- the I/O shell -------------------------------------------------------------------------


async def _ask(
    client: httpx.AsyncClient,
    gate: asyncio.Semaphore,
    target: Target,
    item: SuiteItem,
    headers: dict[str, str],
) -> Answer:
    async with gate:
        started = time.perf_counter()
        try:
            response = await client.post(
                target.url + _PATHS[item.kind], json=item.body, headers=headers
            )
        except httpx.HTTPError as exc:
            seconds = time.perf_counter() - started
            return Answer(None, seconds, error=f"{type(exc).__name__}: {exc}".rstrip(": "))
        seconds = time.perf_counter() - started
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    version = response.headers.get("x-sluice-model-version") or _fingerprint_version(item, body)
    return read_answer(item.kind, response.status_code, body, seconds, version)


def _fingerprint_version(item: SuiteItem, body: Any) -> str | None:
    """The gateway drops instances' x-sluice-* headers; a worker's `system_fingerprint` is
    "MODEL:VERSION", so the version survives there for generations."""
    fingerprint = body.get("system_fingerprint") if isinstance(body, dict) else None
    prefix = f"{item.body['model']}:"
    if isinstance(fingerprint, str) and fingerprint.startswith(prefix):
        return fingerprint.removeprefix(prefix)
    return None


async def _ask_all(
    client: httpx.AsyncClient, target: Target, items: Sequence[SuiteItem], options: CompareOptions
) -> list[Answer]:
    headers = {} if options.api_key is None else {"authorization": f"Bearer {options.api_key}"}
    if target.group is not None:
        headers["x-sluice-group"] = target.group
    gate = asyncio.Semaphore(options.concurrency)
    return list(await asyncio.gather(*(_ask(client, gate, target, i, headers) for i in items)))


async def compare(
    suite_path: Path,
    a: Target,
    b: Target,
    options: CompareOptions,
    transport: httpx.AsyncBaseTransport | None = None,
) -> dict[str, Any]:
    """Send the suite to both targets (concurrently, `options.concurrency` each) and score.

    Raises SpecError for a bad suite (exit 2) and Unavailable when a target answered no
    request at all (exit 6): a wrong URL should not read as "everything differs"."""
    items = load_suite(suite_path)
    digest = hashlib.sha256(suite_path.read_bytes()).hexdigest()
    started_at = time.time()
    started = time.perf_counter()
    async with httpx.AsyncClient(
        timeout=options.timeout_s, trust_env=False, transport=transport
    ) as client:
        answers_a, answers_b = await asyncio.gather(
            _ask_all(client, a, items, options), _ask_all(client, b, items, options)
        )
    for name, target, answers in (("a", a, answers_a), ("b", b, answers_b)):
        if all(answer.status is None for answer in answers):
            raise Unavailable(
                f"--{name} {target.spec}: no request got an HTTP answer from {target.url} "
                f"({answers[0].error})"
            )
    rows = [score_item(i, x, y) for i, x, y in zip(items, answers_a, answers_b, strict=True)]
    scored = summarise(rows, options.worst)
    return {
        "schema": SCHEMA,
        "suite": {"path": str(suite_path), "sha256": digest, "items": len(items)},
        "a": a.to_json(),
        "b": b.to_json(),
        "started_at": started_at,
        "duration_s": round(time.perf_counter() - started, 6),
        "summary": scored["summary"],
        "worst": scored["worst"],
        "items": rows,
    }
