"""Cross-reference checks a field validator cannot do: names, pools, memory fit, targets.

Each problem is `(path, message)`; the loader turns paths into file:line. A spec that could
not start (a model that does not fit its accelerator) is rejected here, before launch (G2):
by its declared `memory_gb`, and, for a model whose runtime names a local model directory
(`model_path`), by the estimate from its config.json (`spec.memory`). Reading that directory
is I/O, so the caller hands in the reader; without one that check is skipped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from sluice.core.errors import SluiceError, SpecError
from sluice.spec.devices import device_problems
from sluice.spec.drills import drill_refusal
from sluice.spec.hfconfig import ModelConfigError, normalise_dtype
from sluice.spec.keys import KeyPath
from sluice.spec.memory import group_memory_problem
from sluice.spec.modeldir import ModelDir
from sluice.spec.models import GroupSpec, PlatformSpec, RouteSpec
from sluice.spec.quota import BudgetSpec
from sluice.spec.servers import names_model_dir, server_problems

__all__ = ["ModelReader", "check_keys", "check_platform", "model_path_of"]

Problem = tuple[tuple[str | int, ...], str]
ModelReader = Callable[[str], ModelDir]
"""Reads a model directory (`spec.modeldir.read_model_dir`); raises SluiceError."""


def check_platform(spec: PlatformSpec, read_model: ModelReader | None = None) -> list[Problem]:
    """Every cross-reference problem; `read_model` enables the model-directory checks."""
    return [
        *_unique_names(spec),
        *check_keys(spec),
        *_group_resources(spec),
        *_pool_capacity(spec),
        *_cluster_pools(spec),
        *_references(spec),
        *_schedules(spec),
        *_advisory(spec),
        *_sleeping_standby(spec),
        *_quotas(spec),
        *_rollouts(spec),
        *_drills(spec),
        *_alert_rules(spec),
        *device_problems(spec),
        *(p for i, g in enumerate(spec.groups) for p in server_problems(i, g)),
        *(_model_memory(spec, read_model) if read_model is not None else ()),
    ]


def _unique_names(spec: PlatformSpec) -> Iterator[Problem]:
    sections: dict[str, list[str]] = {
        "pools": [p.name for p in spec.pools],
        "groups": [g.name for g in spec.groups],
        "tenants": [t.name for t in spec.tenants],
    }
    for section, names in sections.items():
        seen = Counter(names)
        for i, name in enumerate(names):
            if seen[name] > 1:
                yield (section, i, "name"), f"duplicate name {name!r}; names must be unique"
    tags = Counter(r.tag for r in spec.routes)
    for i, r in enumerate(spec.routes):
        if tags[r.tag] > 1:
            yield ("routes", i, "tag"), f"duplicate tag {r.tag!r}; every rule needs its own tag"


def check_keys(spec: PlatformSpec) -> list[Problem]:
    """Each key (plain, digest, or from a key source; compared by digest) belongs to one
    tenant, once. Messages name where the key was written, never the key."""
    problems: list[Problem] = []
    owners: dict[str, str] = {}
    for i, t in enumerate(spec.tenants):
        entries = sorted(t.key_digests(), key=lambda e: _written_order(e[0]))
        mine: dict[str, int] = {}
        for n, (at, digest) in enumerate(entries):
            path = ("tenants", i, *at)
            first = mine.setdefault(digest, n)
            if first != n:
                where = (
                    "the same source" if entries[first][0] == at else _relative(entries[first][0])
                )
                problem = (
                    path,
                    f"this key is listed twice for the tenant (also at {where}; a plain key and "
                    "its sha256 digest are the same key); remove one",
                )
            else:
                other = owners.setdefault(digest, t.name)
                if other == t.name:
                    continue
                problem = path, f"this key already belongs to {other!r}; give each tenant its own"
            if problem not in problems:
                problems.append(problem)
    return problems


_KEY_FIELDS = ("api_keys", "api_key_sha256", "api_keys_env", "api_keys_file")


def _written_order(at: KeyPath) -> tuple[int, int]:
    """Sort key: field, then position in it (a source's keys keep their order: stable)."""
    index = at[1] if len(at) > 1 else 0
    return _KEY_FIELDS.index(str(at[0])), index if isinstance(index, int) else 0


def _relative(path: KeyPath) -> str:
    """("api_keys", 2) -> 'api_keys[2]'."""
    return "".join(f"[{p}]" if isinstance(p, int) else p for p in path)


def _group_resources(spec: PlatformSpec) -> Iterator[Problem]:
    for i, g in enumerate(spec.groups):
        pool = spec.pool(g.resources.pool)
        if pool is None:
            names = ", ".join(p.name for p in spec.pools)
            yield (
                ("groups", i, "resources", "pool"),
                f"no pool named {g.resources.pool!r}; pools: {names}",
            )
            continue
        if pool.purpose != "inference":
            yield (
                ("groups", i, "resources", "pool"),
                f"pool {pool.name!r} is a {pool.purpose} pool; inference groups need an "
                "inference pool (Q5)",
            )
        capacity = pool.memory_gb * g.resources.accelerators
        if g.resources.memory_gb > capacity:
            yield (
                ("groups", i, "resources", "memory_gb"),
                f"{g.resources.memory_gb:g} GiB does not fit {g.resources.accelerators} x "
                f"{pool.memory_gb:g} GiB {pool.accelerator} accelerator(s) of pool "
                f"{pool.name!r}; ask for more accelerators or a high-memory pool",
            )
        need = sum(m.memory_gb for m in g.models.values())
        if need > g.resources.memory_gb:
            yield (
                ("groups", i, "resources", "memory_gb"),
                f"the group's models need {need:g} GiB but an instance gets "
                f"{g.resources.memory_gb:g} GiB; raise resources.memory_gb to >= {need:g}",
            )


def _pool_capacity(spec: PlatformSpec) -> Iterator[Problem]:
    for i, pool in enumerate(spec.pools):
        if pool.inventory == "cluster":  # the cluster's size, known only live
            continue
        used = sum(
            g.replicas * g.resources.accelerators
            for g in spec.groups
            if g.resources.pool == pool.name
        )
        if used > pool.count:
            yield (
                ("pools", i, "count"),
                f"groups ask for {used} accelerators but the pool has {pool.count}; "
                "lower replicas or grow the pool",
            )


def _cluster_pools(spec: PlatformSpec) -> Iterator[Problem]:
    """On Ray the cluster assigns each actor its GPUs; this machine's device ids mean
    nothing on another node. A pool sized by the cluster counts one accelerator type, which
    no other such pool counts too."""
    typed: dict[str, str] = {}
    for i, pool in enumerate(spec.pools):
        if pool.inventory != "cluster":
            continue
        if spec.instances.runtime != "ray":
            yield (
                ("pools", i, "inventory"),
                "inventory: cluster reads the Ray cluster's nodes: set instances.runtime: ray, "
                "or declare the pool's count (inventory: declared)",
            )
        elif pool.accelerator_type is None:
            yield (
                ("pools", i, "accelerator_type"),
                "inventory: cluster counts the nodes' accelerator_type:<name> resource: name it "
                "with accelerator_type (e.g. H200)",
            )
        elif pool.accelerator_type in typed:
            yield (
                ("pools", i, "accelerator_type"),
                f"pool {typed[pool.accelerator_type]!r} already counts the cluster's "
                f"{pool.accelerator_type}: one pool per accelerator type when the cluster sizes it",
            )
        else:
            typed[pool.accelerator_type] = pool.name
    if spec.instances.runtime != "ray":
        return
    for i, pool in enumerate(spec.pools):
        if pool.devices is not None:
            yield (
                ("pools", i, "devices"),
                "instances.runtime is ray: Ray pins each instance to its node's GPUs; "
                "remove devices (name the type with accelerator_type)",
            )


def _references(spec: PlatformSpec) -> Iterator[Problem]:
    groups = {g.name: g for g in spec.groups}
    for i, g in enumerate(spec.groups):
        if g.backup is not None and (g.backup == g.name or g.backup not in groups):
            yield ("groups", i, "backup"), f"backup {g.backup!r} must be another existing group"
    for i, r in enumerate(spec.routes):
        yield from _route_groups(i, r, groups)
        yield from _mirror_tenants(i, r, spec)
    tenant_names = {t.name for t in spec.tenants}
    for i, r in enumerate(spec.routes):
        for j, t in enumerate(r.match.tenants):
            if t not in tenant_names:
                yield ("routes", i, "match", "tenants", j), f"no tenant named {t!r}"
    for i, tenant in enumerate(spec.tenants):
        for j, gname in enumerate(tenant.groups):
            if gname != "*" and gname not in groups:
                yield ("tenants", i, "groups", j), f"no group named {gname!r}"


def _alert_rules(spec: PlatformSpec) -> Iterator[Problem]:
    groups = {g.name for g in spec.groups}
    seen: Counter[tuple[str, str]] = Counter(
        (r.group, r.name) for r in spec.observability.alerts.rules
    )
    for i, rule in enumerate(spec.observability.alerts.rules):
        path = ("observability", "alerts", "rules", i)
        if rule.group != "*" and rule.group not in groups:
            yield (*path, "group"), f"no group named {rule.group!r}; name one, or '*' for all"
        if seen[rule.group, rule.name] > 1:
            yield (*path, "name"), f"duplicate rule {rule.name!r} for group {rule.group!r}"


def _schedules(spec: PlatformSpec) -> Iterator[Problem]:
    """Scheduled floors name existing templates and have cron expressions that parse."""
    from croniter import croniter

    for name, entries in spec.schedule_templates.items():
        for j, entry in enumerate(entries):
            if not croniter.is_valid(entry.cron):
                yield ("schedule_templates", name, j, "cron"), f"invalid cron {entry.cron!r}"
    for i, g in enumerate(spec.groups):
        if g.autoscaling is None:
            continue
        for j, item in enumerate(g.autoscaling.schedules):
            path: tuple[str | int, ...] = ("groups", i, "autoscaling", "schedules", j)
            if isinstance(item, str):
                if item not in spec.schedule_templates:
                    known = ", ".join(spec.schedule_templates) or "none defined"
                    yield path, f"no schedule template {item!r}; schedule_templates: {known}"
            elif not croniter.is_valid(item.cron):
                yield (*path, "cron"), f"invalid cron {item.cron!r}"


def _drills(spec: PlatformSpec) -> Iterator[Problem]:
    """Scheduled drills have their own names and name a group a drill can exercise."""
    names = Counter(d.name for d in spec.drills)
    for i, d in enumerate(spec.drills):
        if names[d.name] > 1:
            yield ("drills", i, "name"), f"duplicate name {d.name!r}; names must be unique"
        g = spec.group(d.group)
        if g is None:
            known = ", ".join(x.name for x in spec.groups) or "none defined"
            yield ("drills", i, "group"), f"no group named {d.group!r}; groups: {known}"
            continue
        refused = drill_refusal(g)
        if refused is not None and d.enabled:
            yield ("drills", i, "group"), f"{refused[1]} (groups.{g.name}.{refused[0]})"


def _advisory(spec: PlatformSpec) -> Iterator[Problem]:
    """An advisory autoscaler (issue 16) leaves the count to `replicas`: a group parked at
    0 could serve nothing, and a warm standby has no autoscaler to bring it into rotation."""
    for i, g in enumerate(spec.groups):
        a = g.autoscaling
        if a is None or a.mode != "advisory":
            continue
        path: tuple[str | int, ...] = ("groups", i)
        if g.replicas == 0:
            yield (
                (*path, "replicas"),
                "an advisory autoscaler only advises: the group runs `replicas` (or a "
                "`sluice scale` override), and 0 would serve no request; set replicas to "
                "the count to run while you watch, or autoscaling.mode: active",
            )
        for field in ("warm_standby", "sleeping_standby"):
            if getattr(a, field):
                yield (
                    (*path, "autoscaling", field),
                    f"{field} {getattr(a, field)} waits for an autoscaler to bring it into "
                    f"rotation, and an advisory one brings nothing in; set {field}: 0, or "
                    "autoscaling.mode: active",
                )


def _sleeping_standby(spec: PlatformSpec) -> Iterator[Problem]:
    """Sleeping standby is put to sleep and woken through the server's own endpoints: every
    model of the group must be a `command` server that declares them, or a `sim` model (the
    sim worker has vLLM's)."""
    for i, g in enumerate(spec.groups):
        if g.autoscaling is None or not g.autoscaling.sleeping_standby:
            continue
        for name, m in g.models.items():
            declared = m.runtime == "command" and m.command is not None and m.command.sleep
            if m.runtime != "sim" and not declared:
                yield (
                    ("groups", i, "models", name),
                    f"sleeping_standby needs servers that can sleep: give model {name!r} "
                    "`runtime: command` and `command.sleep` (vLLM: --enable-sleep-mode, "
                    "sleep_path /sleep, wake_path /wake_up), or set "
                    "autoscaling.sleeping_standby: 0",
                )


# The longest calendar month: a per_month budget must cover the guaranteed rate for all of it.
_MONTH_HOURS = 31 * 24


def _quotas(spec: PlatformSpec) -> Iterator[Problem]:
    """Guarantees fit their pool; caps leave room for the group's floor; budgets cover the
    guaranteed spend rate (Q1-Q3, Q6). Inference groups on training pools: `_group_resources`."""
    pools = {p.name: p for p in spec.pools}
    for i, pool in enumerate(spec.pools):
        owners = [g for g in spec.groups if g.resources.pool == pool.name and g.quota.guaranteed]
        total = sum(g.quota.guaranteed for g in owners)
        if total > pool.count:
            parts = ", ".join(f"{g.name}: {g.quota.guaranteed}" for g in owners)
            yield (
                ("pools", i, "count"),
                f"groups guarantee {total} accelerators in pool {pool.name!r} ({parts}) but it "
                f"has {pool.count}; lower the guarantees or grow the pool",
            )
    guaranteed_rate = 0.0
    guaranteed_units = 0
    for i, g in enumerate(spec.groups):
        gpool = pools.get(g.resources.pool)
        if gpool is None:
            continue  # reported by _group_resources
        q, per = g.quota, g.resources.accelerators
        path: tuple[str | int, ...] = ("groups", i, "quota")
        if q.limit is not None and q.limit > gpool.count:
            yield (
                (*path, "limit"),
                f"limit {q.limit} exceeds pool {gpool.name!r}, which has {gpool.count} "
                "accelerators",
            )
        if q.limit is not None and 0 < q.limit < per:
            yield (
                (*path, "limit"),
                f"limit {q.limit} is below one instance's {per} accelerators",
            )
        caps = [(q.limit, "limit")] if q.limit is not None else []
        if q.borrow_limit is not None:
            caps.append((q.guaranteed + q.borrow_limit, "guaranteed + borrow_limit"))
        floor, what = _floor(g)
        for cap, name in caps:
            if floor * per > cap:
                yield (
                    (*path, "limit" if name == "limit" else "borrow_limit"),
                    f"{what} needs {floor} x {per} = {floor * per} accelerators but {name} is "
                    f"{cap}; raise it or lower {what}",
                )
        rate = q.guaranteed * gpool.price_per_hour
        guaranteed_rate += rate
        guaranteed_units += q.guaranteed
        if g.budget is not None:
            yield from _budget_covers(
                ("groups", i, "budget"), g.budget, rate, q.guaranteed, f"{g.name}'s"
            )
    if spec.budget is not None:
        yield from _budget_covers(
            ("budget",), spec.budget, guaranteed_rate, guaranteed_units, "all groups'"
        )


def _floor(g: GroupSpec) -> tuple[int, str]:
    """The fewest instances the group must run, and the field that says so (an advisory
    autoscaler's group runs its `replicas`)."""
    if g.autoscaling is None or g.autoscaling.mode == "advisory":
        return g.replicas, "replicas"
    if g.autoscaling.stable > g.autoscaling.min:
        return g.autoscaling.stable, "autoscaling.stable"
    return g.autoscaling.min, "autoscaling.min"


def _budget_covers(
    path: tuple[str | int, ...], budget: BudgetSpec, rate: float, units: int, whose: str
) -> Iterator[Problem]:
    """A budget never cuts below a guarantee: one that could not carry the guarantees
    would promise units it will refuse."""
    if budget.max_accelerators is not None and budget.max_accelerators < units:
        yield (
            (*path, "max_accelerators"),
            f"max_accelerators {budget.max_accelerators} is below {whose} guaranteed "
            f"{units} accelerators; raise it or lower the guarantees",
        )
    hours = budget.accelerator_hours_per_month
    if hours is not None and hours < units * _MONTH_HOURS:
        yield (
            (*path, "accelerator_hours_per_month"),
            f"accelerator_hours_per_month {hours:g} is below {whose} guaranteed use for a "
            f"{_MONTH_HOURS} h month ({units} x {_MONTH_HOURS} = {units * _MONTH_HOURS})",
        )
    if budget.per_hour is not None and budget.per_hour < rate:
        yield (
            (*path, "per_hour"),
            f"per_hour {budget.per_hour:g} is below {whose} guaranteed spend rate {rate:g}/h "
            "(guaranteed accelerators x price_per_hour)",
        )
    if budget.per_month is not None and budget.per_month < rate * _MONTH_HOURS:
        yield (
            (*path, "per_month"),
            f"per_month {budget.per_month:g} is below {whose} guaranteed spend for a "
            f"{_MONTH_HOURS} h month ({rate:g}/h x {_MONTH_HOURS} = {rate * _MONTH_HOURS:g})",
        )


def _rollouts(spec: PlatformSpec) -> Iterator[Problem]:
    """Rollouts name two existing groups of one business where the canary serves every
    model of the baseline (requests move between them unchanged); a group is the baseline
    (or the canary) of one rollout at most, so the gateway's split is never ambiguous;
    paced tenants exist; a tenant that may reach the baseline may reach the canary (R7)."""
    groups = {g.name: g for g in spec.groups}
    tenants = {t.name: t for t in spec.tenants}
    names = Counter(r.name for r in spec.rollouts)
    seen: dict[tuple[str, str], int] = {}
    for i, r in enumerate(spec.rollouts):
        path: tuple[str | int, ...] = ("rollouts", i)
        if names[r.name] > 1:
            yield (*path, "name"), f"duplicate rollout name {r.name!r}; names must be unique"
        for role in ("baseline", "canary"):
            gname = getattr(r, role)
            first = seen.setdefault((role, gname), i)
            if first != i:
                yield (
                    (*path, role),
                    f"group {gname!r} is already the {role} of rollouts[{first}] "
                    f"({spec.rollouts[first].name!r}); remove "
                    "finished rollouts from the spec",
                )
            if gname not in groups:
                yield (*path, role), f"no group named {gname!r}; groups: {', '.join(groups)}"
        base, canary = groups.get(r.baseline), groups.get(r.canary)
        if base is not None and canary is not None:
            missing = [m for m in base.models if m not in canary.models]
            if missing:
                yield (
                    (*path, "canary"),
                    f"canary {canary.name!r} does not serve model(s) {', '.join(missing)} of "
                    f"baseline {base.name!r}; it serves {', '.join(canary.models)}",
                )
            if base.business != canary.business:
                yield (
                    (*path, "canary"),
                    f"canary {canary.name!r} serves business {canary.business!r} but baseline "
                    f"{base.name!r} serves {base.business!r}; they must match (R7)",
                )
        for field in ("early", "late"):
            for j, tname in enumerate(getattr(r.pacing, field)):
                if tname not in tenants:
                    yield (*path, "pacing", field, j), f"no tenant named {tname!r}"
        for j, t in enumerate(spec.tenants):
            if "*" in t.groups or r.baseline not in t.groups or r.canary in t.groups:
                continue
            yield (
                ("tenants", j, "groups"),
                f"tenant {t.name!r} may reach baseline {r.baseline!r} of rollout {r.name!r} "
                f"but not its canary {r.canary!r}; add {r.canary!r} to its groups",
            )


def _mirror_tenants(i: int, route: RouteSpec, spec: PlatformSpec) -> Iterator[Problem]:
    """A mirror copies a tenant's requests to another group: every tenant the rule can match
    must be allowed that group too (R7), or its data would reach a group it may not use."""
    if route.mirror is None:
        return
    mirror = route.mirror.group
    matched = [t for t in spec.tenants if not route.match.tenants or t.name in route.match.tenants]
    shut_out = [t.name for t in matched if "*" not in t.groups and mirror not in t.groups]
    if shut_out:
        yield (
            ("routes", i, "mirror", "group"),
            f"tenant(s) {', '.join(shut_out)} may reach this rule but not its mirror group "
            f"{mirror!r}; add {mirror!r} to their groups or narrow the rule's tenants",
        )


def _route_groups(i: int, route: RouteSpec, groups: dict[str, GroupSpec]) -> Iterator[Problem]:
    """Every group a rule can send to (split, fallback, mirror) exists and serves its models."""
    places: list[tuple[tuple[str | int, ...], str]] = (
        [(("routes", i, "to"), route.to)]
        if isinstance(route.to, str)
        else [(("routes", i, "to", j, "group"), t.group) for j, t in enumerate(route.to)]
    )
    places += [(("routes", i, "fallback", j), g) for j, g in enumerate(route.fallback)]
    if route.mirror is not None:
        places.append((("routes", i, "mirror", "group"), route.mirror.group))
    for path, name in places:
        group = groups.get(name)
        if group is None:
            yield path, f"no group named {name!r}; groups: {', '.join(groups)}"
            continue
        missing = [m for m in route.match.models if m not in group.models]
        if missing:
            yield (
                path,
                f"group {name!r} does not serve model(s) {', '.join(missing)}; it "
                f"serves {', '.join(group.models)}",
            )


def model_path_of(model: object) -> tuple[str, str] | None:
    """(params block, model_path) when the model's runtime block names a local model
    directory (`transformers: {model_path: ...}`, a `command` with `{model_path}`); None for
    runtimes that have none (sim, embedding). Duck-typed, so a runtime only has to call its
    field `model_path` to be checked."""
    runtime = getattr(model, "runtime", None)
    params = getattr(model, runtime, None) if isinstance(runtime, str) else None
    path = getattr(params, "model_path", None)
    if runtime == "command" and isinstance(path, str) and not names_model_dir(path):
        return None  # a hub id or a single file (GGUF): the server reads it, not Sluice
    return (runtime, path) if isinstance(runtime, str) and isinstance(path, str) and path else None


def _model_memory(spec: PlatformSpec, read: ModelReader) -> Iterator[Problem]:
    """A model directory that is missing or has no readable config.json is located at its
    `model_path`; a model whose estimate (at the group's max_concurrency, and the params'
    max_context / max_model_len or else the config's own) exceeds the instance's
    accelerators is located at the group's `resources`, with the numbers."""
    for i, g in enumerate(spec.groups):
        pool = spec.pool(g.resources.pool)
        for mid, model in g.models.items():
            found = model_path_of(model)
            if found is None:
                continue
            block, path = found
            at: tuple[str | int, ...] = ("groups", i, "models", mid, block, "model_path")
            try:
                mdir = read(path)
            except SpecError as exc:
                yield at, "; ".join(f"{issue.file}: {issue.message}" for issue in exc.issues)
                continue
            except SluiceError as exc:
                yield at, exc.message
                continue
            if pool is None or pool.purpose != "inference":
                continue  # reported by _group_resources
            params = getattr(model, block)
            dtype = _param_dtype(params)
            try:
                problem = group_memory_problem(
                    mdir.config,
                    g.resources,
                    pool,
                    concurrency=g.max_concurrency,
                    max_context=_param_int(params, "max_context", "max_model_len"),
                    dtype=dtype,
                    weight_bytes=mdir.weight_bytes if dtype is None else None,
                )
            except (ModelConfigError, ValueError) as exc:
                yield at, f"{mdir.path}/config.json: {exc}"
                continue
            if problem is not None:
                yield ("groups", i, "resources"), f"model {mid!r} {problem}"


def _param_int(params: object, *names: str) -> int | None:
    for name in names:
        value = getattr(params, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _param_dtype(params: object) -> str | None:
    """The params' dtype when it overrides the checkpoint's ('auto' / unset: None)."""
    value = getattr(params, "dtype", None)
    return normalise_dtype(value) if isinstance(value, str) else None
