"""Comparing two versions' answers to one fixed suite (C5), pure: the suite, the answers, their
scores and the report. The one HTTP shell around it, `sluice.comparing`, serves both `sluice
compare` (`sluice.tools.compare`, an outside client) and the controller's compare run at a
rollout's start; it hands the answers here, so the two reports have one shape and meaning.

The suite is JSONL, one OpenAI request body per line: chat (`messages`), text completion
(`prompt`) or embeddings (`input`); an optional `id` names the item and is not sent. Bodies
go out otherwise unchanged, so a suite pins temperature and the like itself. A target is
`group:NAME` (through the gateway, header `x-sluice-group`, operator tenants only) or a base
URL `http://host:port` (one instance, no gateway).

The report is one JSON document that is archived with a rollout, so its shape is versioned
(`schema`) and only ever grows. Version "sluice.compare/1":

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

Text similarity is two numbers because each misses something: the character-level
`difflib.SequenceMatcher` ratio sees reordering and small edits; the word-set Jaccard index
sees vocabulary drift (a new style reads with other words) and ignores order. Two-sample KS
(`sluice.policy.evidence`) and the style features are the live canary analysis' own, so
compare reports and rollouts measure drift alike.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import statistics
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any, Literal

from sluice.core.errors import SpecError, SpecIssue, Unavailable
from sluice.policy.criteria import style_features
from sluice.policy.evidence import ks_test

__all__ = [
    "PATHS",
    "SCHEMA",
    "Answer",
    "CompareOptions",
    "Kind",
    "Suite",
    "SuiteItem",
    "Target",
    "answer_version",
    "cosine",
    "distribution",
    "jaccard",
    "parse_suite",
    "percentile",
    "read_answer",
    "report",
    "request_headers",
    "score_item",
    "sequence_ratio",
    "summarise",
]

SCHEMA = "sluice.compare/1"
Kind = Literal["chat", "completion", "embedding"]
PATHS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "embedding": "/v1/embeddings",
}
"""Where each kind of item is sent, under a target's base URL."""
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
class Suite:
    path: str
    sha256: str
    """Of the file's bytes."""
    items: tuple[SuiteItem, ...]

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "items": len(self.items)}


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


# --- the suite -----------------------------------------------------------------------------


def parse_suite(data: bytes, path: str, option: str = "--suite") -> Suite:
    """Parse a JSONL suite's bytes; every bad line becomes a SpecIssue naming `path` and the
    line (exit 2). `option` names where the suite was given, for a file that is not UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([SpecIssue(option, f"cannot read the suite: {exc}", path)]) from None
    items: list[SuiteItem] = []
    issues: list[SpecIssue] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or len(issues) >= _MAX_ISSUES:
            continue
        item, problem = _parse_line(raw, number, len(items))
        if problem is not None:
            issues.append(SpecIssue(problem[0], problem[1], path, number))
        elif item is not None:
            if item.id in seen:
                message = f"duplicate id {item.id!r} (first on line {seen[item.id]})"
                issues.append(SpecIssue("id", message, path, number))
            seen.setdefault(item.id, number)
            items.append(item)
    if not items and not issues:
        issues.append(SpecIssue("", "the suite has no requests (one JSON body per line)", path))
    if issues:
        raise SpecError(issues)
    return Suite(path, hashlib.sha256(data).hexdigest(), tuple(items))


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


def request_headers(target: Target, api_key: str | None) -> dict[str, str]:
    """The headers every request to `target` carries: the key, and the group to pick."""
    headers = {} if api_key is None else {"authorization": f"Bearer {api_key}"}
    if target.group is not None:
        headers["x-sluice-group"] = target.group
    return headers


# --- reading answers -----------------------------------------------------------------------


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


def answer_version(item: SuiteItem, header: str | None, body: Any) -> str | None:
    """The answering version: the `x-sluice-model-version` header, else the body's
    `system_fingerprint`. The gateway drops instances' x-sluice-* headers; a worker's
    fingerprint is "MODEL:VERSION", so the version survives there for generations."""
    if header:
        return header
    fingerprint = body.get("system_fingerprint") if isinstance(body, dict) else None
    prefix = f"{item.body['model']}:"
    if isinstance(fingerprint, str) and fingerprint.startswith(prefix):
        return fingerprint.removeprefix(prefix)
    return None


def _vector(raw: Any) -> tuple[float, ...]:
    if isinstance(raw, str):  # encoding_format: base64, little-endian float32
        packed = base64.b64decode(raw)
        return struct.unpack(f"<{len(packed) // 4}f", packed)
    return tuple(float(x) for x in raw)


def _error_message(status: int, body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message") or body["error"])
    return f"HTTP {status}: {str(body)[:200]}"


# --- how far apart two answers are ---------------------------------------------------------


def sequence_ratio(a: str, b: str) -> float:
    """difflib's ratio in [0, 1]: 2 * matched characters / total characters; two empty
    strings are identical (1.0)."""
    if a == b:
        return 1.0
    return SequenceMatcher(None, a, b, autojunk=False).ratio()


def jaccard(a: str, b: str) -> float:
    """Jaccard index of the lower-cased word sets: shared / all distinct words, in [0, 1];
    both empty -> 1.0."""
    left, right = set(a.lower().split()), set(b.lower().split())
    union = left | right
    return 1.0 if not union else len(left & right) / len(union)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity in [-1, 1]; 0.0 when either vector is all zeros or widths differ."""
    if len(a) != len(b):
        return 0.0
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return 0.0 if norms == 0 else max(-1.0, min(1.0, dot / norms))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    """count, mean, min, p50, p95, max of `values` (None where there are none)."""
    if not values:
        return {"count": 0, "mean": None, "min": None, "p50": None, "p95": None, "max": None}
    return {
        "count": len(values),
        "mean": statistics.fmean(values),
        "min": min(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "max": max(values),
    }


# --- scoring and the report ----------------------------------------------------------------


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


def report(
    suite: Suite,
    a: Target,
    b: Target,
    answers: tuple[Sequence[Answer], Sequence[Answer]],
    started_at: float,
    duration_s: float,
    worst: int,
) -> dict[str, Any]:
    """The "sluice.compare/1" document from both sides' answers, in suite order.

    Raises Unavailable when a target answered no request at all (exit 6): a wrong URL
    should not read as "everything differs"."""
    for name, target, side in (("a", a, answers[0]), ("b", b, answers[1])):
        if all(answer.status is None for answer in side):
            raise Unavailable(
                f"--{name} {target.spec}: no request got an HTTP answer from {target.url} "
                f"({side[0].error})"
            )
    rows = [score_item(i, x, y) for i, x, y in zip(suite.items, *answers, strict=True)]
    scored = summarise(rows, worst)
    return {
        "schema": SCHEMA,
        "suite": suite.to_json(),
        "a": a.to_json(),
        "b": b.to_json(),
        "started_at": started_at,
        "duration_s": round(duration_s, 6),
        "summary": scored["summary"],
        "worst": scored["worst"],
        "items": rows,
    }
