"""Spec of servers Sluice did not write (`command`, `external`) and of pinned devices: the
examples validate, templates fill as written, and every mistake is located at validate."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.core import SpecError
from sluice.core.argv import placeholders_in, render
from sluice.spec import load_spec_file, load_spec_text

EXAMPLES = Path(__file__).parents[2] / "examples"

BASE = """
pools:
  - name: gpu
    accelerator: h100
    count: {count}
    memory_gb: 80
{pool_extra}
groups:
  - name: llm
    owner: a@example.com
    business: search
    alert_channel: "#x"
    models:
      qwen:
{model}
    resources: {{pool: gpu, accelerators: {units}, memory_gb: 20{res_extra}}}
{group_extra}
"""

COMMAND = """\
        runtime: command
        command:
          argv: [vllm, serve, "{model_path}", --served-model-name, "{model}",
                 --host, "{host}", --port, "{port}"]
          model_path: Qwen/Qwen2.5-0.5B-Instruct
"""


def spec(
    model: str = COMMAND,
    *,
    count: int = 4,
    pool_extra: str = "    devices: [0, 1, 2, 3]",
    units: int = 1,
    res_extra: str = "",
    group_extra: str = "",
) -> str:
    return BASE.format(
        count=count,
        pool_extra=pool_extra,
        model=model,
        units=units,
        res_extra=res_extra,
        group_extra=group_extra,
    )


def issues(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, "broken.yaml")
    return [str(i) for i in caught.value.issues]


@pytest.mark.parametrize("name", ["vllm", "sglang", "llamacpp"])
def test_every_server_example_validates_and_passes_port_and_model(name: str) -> None:
    loaded = load_spec_file(EXAMPLES / f"{name}.yaml").spec
    [group] = loaded.groups
    [(model_id, model)] = group.models.items()
    cmd = model.command
    assert cmd is not None and cmd.metrics_path == "/metrics"
    argv = [
        render(a, {"host": "h", "port": "9", "model": model_id, "model_path": "p"})
        for a in cmd.argv
    ]
    assert argv[argv.index("--port") + 1] == "9" and argv[argv.index("--host") + 1] == "h"
    assert model_id in argv  # served under the id callers send
    program = {"vllm": "vllm", "sglang": "sglang.launch_server", "llamacpp": "llama-server"}
    assert program[name] in argv


def test_the_transformers_serve_example_pins_the_server_to_its_model_id() -> None:
    """`transformers serve MODEL` answers only for MODEL, by that exact name: the model id
    callers send is what the argv passes; it has no /metrics."""
    [group] = load_spec_file(EXAMPLES / "transformers-serve.yaml").spec.groups
    [(model_id, model)] = group.models.items()
    cmd = model.command
    assert cmd is not None and cmd.metrics_path is None and cmd.health_path == "/health"
    argv = [render(a, {"host": "h", "port": "9", "model": model_id}) for a in cmd.argv]
    assert argv[:3] == ["transformers", "serve", model_id]
    assert argv[argv.index("--port") + 1] == "9" and argv[argv.index("--host") + 1] == "h"


def test_placeholders_are_checked_and_rendered_as_written() -> None:
    assert placeholders_in("--port={port} {{literal}}") == {"port"}
    assert render("--port={port} {{literal}}", {"port": "8001"}) == "--port=8001 {literal}"
    for bad, says in [
        ("{prot}", "unknown placeholder {prot}"),
        ("{port:05d}", "no conversion or format spec"),
        ("{port!r}", "no conversion or format spec"),
        ("{port", "write a literal brace"),
        ("{}", "unknown placeholder {}"),
    ]:
        with pytest.raises(ValueError, match=says.replace("{", r"\{").replace("}", r"\}")):
            placeholders_in(bad)


def test_a_typo_in_a_placeholder_is_located() -> None:
    [msg] = issues(spec(COMMAND.replace('"{port}"', '"{prot}"')))
    assert "groups[0].models.qwen.command.argv" in msg and "unknown placeholder {prot}" in msg
    assert msg.startswith("broken.yaml:")


def test_a_command_must_take_the_port_and_its_model_path() -> None:
    [msg] = issues(spec(COMMAND.replace('--port, "{port}"', "--port, '8000'")))
    assert "neither argv nor env uses {port}" in msg
    [msg] = issues(spec(COMMAND.replace("          model_path: Qwen/Qwen2.5-0.5B-Instruct\n", "")))
    assert "argv uses {model_path}; set model_path" in msg
    # the port may come through the environment instead (llama.cpp reads LLAMA_ARG_PORT)
    via_env = (
        COMMAND.replace('--port, "{port}"', "--verbose")
        + '          env: {LLAMA_ARG_PORT: "{port}"}\n'
    )
    load_spec_text(spec(via_env))


def test_env_may_not_take_over_what_sluice_sets() -> None:
    [msg] = issues(spec(COMMAND + '          env: {CUDA_VISIBLE_DEVICES: "0"}\n'))
    assert "env may not set CUDA_VISIBLE_DEVICES" in msg and "{gpu_ids}" in msg


def test_runtime_and_block_must_match() -> None:
    [msg] = issues(spec("        runtime: command\n"))
    assert "runtime 'command' needs a 'command:' block" in msg
    [msg] = issues(spec(COMMAND.replace("runtime: command", "runtime: sim")))
    assert "remove the 'command:' block" in msg


def test_a_server_is_its_groups_only_model() -> None:
    two = COMMAND + "      other:\n        runtime: sim\n"
    [msg] = issues(spec(two))
    assert "groups[0].models.qwen.runtime" in msg and "must be its group's only model" in msg


EXTERNAL = """\
        runtime: external
        external:
          endpoints:
            - {url: "http://10.0.0.5:8000"}
            - {url: "http://10.0.0.6:8000", api_key_env: FLEET_KEY}
"""


def test_an_external_group_runs_one_instance_per_endpoint() -> None:
    loaded = load_spec_text(spec(EXTERNAL, pool_extra="")).spec
    assert loaded.groups[0].replicas == 2
    [msg] = issues(spec(EXTERNAL, pool_extra="", group_extra="    replicas: 3"))
    assert "groups[0].replicas" in msg and "lists 2 endpoint(s)" in msg
    scaled = "    autoscaling: {policy: sluice, min: 1, max: 2}"
    assert any(
        "remove autoscaling" in m for m in issues(spec(EXTERNAL, pool_extra="", group_extra=scaled))
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://10.0.0.5:8000",
        "http://10.0.0.5",
        "http://10.0.0.5:8000/v1",
        "http://u@h:1",
        "10.0.0.5:8000",
    ],
)
def test_external_urls_are_plain_http_host_port(url: str) -> None:
    bad = EXTERNAL.replace("http://10.0.0.5:8000", url)
    [msg] = issues(spec(bad, pool_extra=""))
    assert "groups[0].models.qwen.external.endpoints[0].url" in msg and "http://HOST:PORT" in msg


def test_an_endpoint_listed_twice_is_refused() -> None:
    bad = EXTERNAL.replace("10.0.0.6:8000", "10.0.0.5:8000")
    [msg] = issues(spec(bad, pool_extra=""))
    assert "listed twice: http://10.0.0.5:8000" in msg


def test_pool_devices_add_up_and_belong_to_one_pool() -> None:
    [msg] = issues(spec(count=3))
    assert "pools[0]" in msg and "count = 3 but 4 device(s)" in msg
    [msg] = issues(spec(pool_extra="    devices: [0, 1, 1, 2]"))
    assert "listed twice: 1" in msg
    [msg] = issues(spec(pool_extra="    units_per_device: 2"))
    assert "list the pool's `devices` too" in msg
    second = "  - {name: gpu2, count: 1, memory_gb: 80, devices: [GPU-3]}"
    text = spec(pool_extra="    devices: [GPU-0, GPU-1, GPU-2, GPU-3]\n" + second)
    [msg] = issues(text)
    assert "pools[1].devices" in msg and "already in pool 'gpu'" in msg


def test_whole_devices_unless_the_group_is_fractional() -> None:
    halves = "    devices: [0, 1]\n    units_per_device: 2"
    [msg] = issues(spec(pool_extra=halves, units=1))
    assert "groups[0].resources.accelerators" in msg and "multiple of 2" in msg
    load_spec_text(spec(pool_extra=halves, units=2))
    load_spec_text(spec(pool_extra=halves, units=1, res_extra=", fractional: true"))
    [msg] = issues(spec(pool_extra=halves, units=3, res_extra=", fractional: true"))
    assert "at most 2 units" in msg
    [msg] = issues(spec(pool_extra="", units=1, res_extra=", fractional: true"))
    assert "nothing to share" in msg


def test_gpu_ids_need_a_pool_that_pins_devices() -> None:
    with_ids = COMMAND.replace("--host,", '--gpus, "{gpu_ids}", --host,')
    load_spec_text(spec(with_ids))
    [msg] = issues(spec(with_ids, pool_extra=""))
    assert "groups[0].models.qwen.command.argv" in msg and "lists no devices" in msg


def test_device_ids_read_as_text_and_a_bad_one_is_refused() -> None:
    loaded = load_spec_text(spec(pool_extra="    devices: [0, 1, GPU-5f3e, MIG-1/2]")).spec
    assert loaded.pools[0].devices == ["0", "1", "GPU-5f3e", "MIG-1/2"]
    [msg] = issues(spec(pool_extra='    devices: [0, 1, 2, "x y"]'))
    assert "pools[0].devices[3]" in msg


def test_a_commands_local_model_directory_is_read_at_validate_but_not_a_hub_id_or_a_file(
    tmp_path: Path,
) -> None:
    def validate(model_path: str) -> list[str]:
        f = tmp_path / "platform.yaml"
        f.write_text(spec(COMMAND.replace("Qwen/Qwen2.5-0.5B-Instruct", model_path)))
        try:
            load_spec_file(f)
        except SpecError as exc:
            return [str(i) for i in exc.issues]
        return []

    assert validate("Qwen/Qwen2.5-0.5B-Instruct") == []  # the server fetches it
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert validate(str(gguf)) == []  # a single-file model: nothing for Sluice to read
    [msg] = validate(str(tmp_path / "missing"))
    assert "groups[0].models.qwen.command.model_path" in msg and "does not exist" in msg


def test_an_external_group_scales_to_at_most_its_endpoints() -> None:
    from sluice.spec.servers import external_scale_problem

    group = load_spec_text(spec(EXTERNAL, pool_extra="")).spec.groups[0]
    assert external_scale_problem(group, 2) == "" and external_scale_problem(group, 0) == ""
    assert "at most 2 replicas" in external_scale_problem(group, 3)
    command_group = load_spec_text(spec()).spec.groups[0]
    assert external_scale_problem(command_group, 50) == ""
