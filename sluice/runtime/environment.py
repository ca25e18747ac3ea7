"""What of Sluice's own environment an instance's process gets: an allow-list, not a
deny-list.

Sluice's environment holds secrets an instance has no business with: tenant keys
(`api_keys_env`), a drill's key (`SLUICE_DRILL_KEY`), the CLI's and gateways' tokens
(`SLUICE_TOKEN`, `SLUICE_GATEWAY_TOKEN`), a database URL with its password
(`SLUICE_DATABASE_URL`), cloud credentials of whoever started it. A model server (or a
model's code) may log, dump or forward its environment, so withholding the secrets Sluice
knows of is not enough: a new one would leak by default. An instance therefore starts from
only what a model server needs (`PASSED_NAMES`, `PASSED_PREFIXES`): the basics of a
process (PATH, HOME, locale, temp dir, Python's own variables), where its libraries and
accelerators are (CUDA, NVIDIA, ROCm, NCCL, LD_LIBRARY_PATH), the ML libraries' settings and
caches (Hugging Face, transformers, torch, vLLM, OpenMP/MKL/OpenBLAS threads); then what
the runtime and the spec set for it on top (`CUDA_VISIBLE_DEVICES`, `SLUICE_INSTANCE_ID`,
a command's `env:`). No `SLUICE_*` variable passes unless named in `SLUICE_PASSED`
(none: the worker takes its whole config on its command line), and a name the spec reads a
key from (`withheld`, `spec.secrets.secret_env_names`) never passes even where the
allow-list would take it (`api_keys_env: HF_KEYS`).

What is not passed and a server needs (a proxy, `HTTPS_PROXY`, or a vendor's variable) is
given in the model's `command.env` in the spec, where a reviewer sees it.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "ALWAYS_WITHHELD",
    "PASSED_NAMES",
    "PASSED_PREFIXES",
    "SLUICE_PASSED",
    "instance_environment",
    "passes",
]

PASSED_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TMP",
        "TEMP",
        "LD_LIBRARY_PATH",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "TOKENIZERS_PARALLELISM",
    }
)
"""Variables passed by exact name: the basics of a process, and where its certificates are."""

PASSED_PREFIXES = (
    "LC_",
    "PYTHON",
    "XDG_",
    "CUDA",
    "NVIDIA",
    "NCCL_",
    "ROCR_",
    "HIP_",
    "HSA_",
    "HF_",
    "HUGGINGFACE_",
    "HUGGING_FACE_",
    "TRANSFORMERS_",
    "TORCH",
    "PYTORCH_",
    "TRITON_",
    "VLLM_",
    "OMP",
    "KMP_",
    "MKL",
    "OPENBLAS",
)
"""Variables passed by prefix: locale, Python, caches, accelerators and their libraries
(on a Ray node the devices Ray gave the actor arrive this way: CUDA_VISIBLE_DEVICES), and
the ML libraries' settings. `HF_TOKEN` passes: a server may need it to fetch a gated
model, and it is the operator's hub credential, not a tenant's or Sluice's."""

SLUICE_PASSED: frozenset[str] = frozenset()
"""`SLUICE_*` variables of Sluice's environment an instance gets: none. The worker takes its
config as JSON on its command line; the variables an instance does see
(`SLUICE_INSTANCE_ID`, `SLUICE_STOP_SIGNAL`) are set by the runtime, not inherited."""

ALWAYS_WITHHELD = frozenset({"SLUICE_TOKEN"})
"""Never passed, whatever the lists say (kept for callers that name it)."""


def passes(name: str) -> bool:
    """Whether a variable of this name may go from Sluice's environment to an instance."""
    if name.startswith("SLUICE_"):
        return name in SLUICE_PASSED and name not in ALWAYS_WITHHELD
    return name in PASSED_NAMES or name.startswith(PASSED_PREFIXES)


def instance_environment(
    environ: Mapping[str, str], withheld: frozenset[str] = frozenset()
) -> dict[str, str]:
    """What of `environ` (Sluice's environment) an instance inherits: the allow-listed
    names, less `withheld` (the variables the spec reads keys from). The runtime adds the
    instance's own variables on top."""
    return {k: v for k, v in environ.items() if passes(k) and k not in withheld}
