"""Compose the training config: verl's `ppo_trainer` defaults, Calc-X overrides, then the user's.

Only hydra-core/omegaconf and verl's YAML files are needed here: verl's package directory is found
with `importlib.util.find_spec` so that composing (and `--print-config`) never imports verl, whose
`__init__` imports torch and ray.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from calcx.trainer.config.scale import (
    GPUS_KEY,
    NODES_KEY,
    RAY_ADDRESS_KEY,
    SERVICES_HOST_KEY,
    ScaleError,
    scale_of,
)

PACKAGE_CONFIG_DIR = Path(__file__).resolve().parent
CALCX_OVERRIDES = PACKAGE_CONFIG_DIR / "calcx.yaml"
ASYNC_OVERRIDES = PACKAGE_CONFIG_DIR / "async.yaml"
AGENT_LOOPS_FILE = PACKAGE_CONFIG_DIR / "agent_loops.yaml"
# calcx's agent loop in verl's registry (`@register` in calcx.trainer.workers.calcx_agent_loop, which
# imports verl and so cannot be imported here) and verl's `default_agent_loop` of a calcx run
CALCX_AGENT_LOOP = "calcx_agent"
TEMPLATES_DIR = PACKAGE_CONFIG_DIR / "templates"
NAMED_TEMPLATES = {"hermes": TEMPLATES_DIR / "hermes_tool_chat.jinja"}
VERL_CONFIG_NAME = "ppo_trainer"
SECRET_KEYS = ("calcx.key",)
#: where the run lease's owner id goes in the run's config (calcx.trainer.run.run_lease takes the
#: lease), for the Ray workers that write the ledger
OWNER_KEY = "calcx.run_owner"
PROFILE_SECTIONS = ("gpu_profiles", "run_profiles")
LONG_KEYS = ("actor_rollout_ref.model.custom_chat_template",)


class ConfigError(ValueError):
    """A config override names a key verl does not have, or a value that cannot be parsed."""


def verl_config_dir() -> Path:
    """verl's `trainer/config` directory, located without importing verl."""
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        raise ConfigError(
            "verl is not installed in this Python environment; install verl==0.9.1 "
            "(the 'trainer-cpu' or 'trainer-gpu' resolve) to compose the training config"
        )
    path = Path(spec.origin).resolve().parent / "trainer" / "config"
    if not (path / f"{VERL_CONFIG_NAME}.yaml").is_file():
        raise ConfigError(f"verl at {path.parent.parent} has no trainer/config/{VERL_CONFIG_NAME}.yaml")
    return path


@dataclass
class ComposeRequest:
    """What the command line asks for, before any file is read."""

    model: str | None = None
    train_files: str | list[str] | None = None
    val_files: str | list[str] | None = None
    server_url: str | None = None
    run_name: str | None = None
    runner: str | None = None
    async_mode: bool = False
    chat_template: str | None = None
    dotlist: list[str] = field(default_factory=list)
    # files in calcx.yaml's format applied after it (and async.yaml), under the flags and dotlist:
    # another run built on calcx's defaults (`calcx anchor train`)
    overlays: list[Path] = field(default_factory=list)
    # memory of this machine's GPU in GiB (None: ask nvidia-smi; 0: no GPU), which picks the
    # settings of calcx.yaml's `gpu_profiles` unless `calcx.gpu_profile` names one
    gpu_memory_gib: float | None = None
    # a `run_profiles` entry of calcx.yaml (a documented run's settings), over the GPU profile and
    # under the flags and dotlist; None: no run profile
    run_profile: str | None = None
    # `--gpus`, `--nnodes`, `--ray-address`, `--services-host` (None: calcx.yaml's one GPU of one
    # node, a Ray of its own, a server on loopback)
    gpus_per_node: int | None = None
    nnodes: int | None = None
    ray_address: str | None = None
    services_host: str | None = None


def _leaves(node: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """(dotted key, value) for every leaf of a nested mapping; lists are leaves."""
    if isinstance(node, dict):
        if not node and prefix:
            yield prefix, {}
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def _has_key(cfg: DictConfig | ListConfig, dotted: str) -> bool:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, DictConfig) or part not in node.keys():  # `in` is False for ??? values
            return False
        node = node._get_node(part)  # no interpolation resolution while walking
    return True


def _set(
    cfg: DictConfig,
    dotted: str,
    value: Any,
    *,
    must_exist: bool,
    origin: str,
    config_name: str = VERL_CONFIG_NAME,
    new_key_hint: str | None = None,
) -> None:
    """Set `dotted`; with `must_exist`, a key verl's config lacks is an error that says how to add
    one where the value came from (`new_key_hint`; a command line's `+key=...` by default)."""
    if must_exist and not _has_key(cfg, dotted):
        hint = new_key_hint or f"write '+{dotted}=...' to add a new key"
        raise ConfigError(
            f"{origin}: '{dotted}' is not a key of verl's {config_name} config; check the spelling, or {hint}"
        )
    with open_dict(cfg):
        OmegaConf.update(cfg, dotted, value, merge=False, force_add=True)


def _load_sections(path: Path) -> dict[str, Any]:
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    if not isinstance(data, dict) or set(data) - {"overrides", "additions", *PROFILE_SECTIONS}:
        raise ConfigError(
            f"{path}: expected a mapping with 'overrides' and 'additions' sections "
            f"(and, in calcx.yaml, {' and '.join(map(repr, PROFILE_SECTIONS))})"
        )
    return {str(k): v for k, v in data.items()}


def _apply_sections(
    cfg: DictConfig,
    data: dict[str, Any],
    origin: str,
    config_name: str = VERL_CONFIG_NAME,
    new_key_hint: str = "put it under the file's 'additions' to add a new key",
) -> None:
    for dotted, value in _leaves(data.get("overrides") or {}):
        _set(cfg, dotted, value, must_exist=True, origin=origin, config_name=config_name, new_key_hint=new_key_hint)
    for dotted, value in _leaves(data.get("additions") or {}):
        _set(cfg, dotted, value, must_exist=False, origin=origin, config_name=config_name)


def profile_new_key_hint(additions_file: Path) -> str:
    """Where a new key goes when a profile (which only changes existing keys) names one."""
    return f"add it under {additions_file.name}'s 'additions' (a profile only changes existing keys)"


def _apply_file(cfg: DictConfig, path: Path, config_name: str = VERL_CONFIG_NAME) -> None:
    data = _load_sections(path)
    for section in PROFILE_SECTIONS:
        if section in data:
            raise ConfigError(f"{path}: {section!r} belongs in calcx.yaml alone")
    _apply_sections(cfg, data, str(path), config_name)


def gpu_memory_gib() -> float:
    """The smallest GPU memory on this machine in GiB, from `nvidia-smi`; 0 where it lists none."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0.0
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        sizes = [float(line) / 1024 for line in out.split() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0.0
    return min(sizes) if sizes else 0.0


#: what a gpu_profiles entry may hold: its threshold, calcx train's settings, calcx warmup's
GPU_PROFILE_KEYS = frozenset({"min_gib", "overrides", "warmup"})


def choose_gpu_profile(
    profiles: dict[str, Any], requested: str, memory_gib: float, setting: str = "calcx.gpu_profile"
) -> str | None:
    """The profile `requested` names, or for `auto` the one with the largest `min_gib` this GPU's
    memory reaches (None: calcx.yaml's own settings, for small GPUs and machines without one).
    `setting` is what the user wrote `requested` as, for the error."""
    for name, entry in profiles.items():
        if not isinstance(entry, dict) or "min_gib" not in entry or set(entry) - GPU_PROFILE_KEYS:
            raise ConfigError(
                f"{CALCX_OVERRIDES.name} gpu_profiles.{name}: expected a mapping with 'min_gib' "
                f"and any of {', '.join(sorted(GPU_PROFILE_KEYS - {'min_gib'}))}"
            )
    if requested == "none":
        return None
    if requested != "auto":
        if requested not in profiles:
            raise ConfigError(
                f"{setting}={requested!r}: no such profile; " f"use auto, none or one of: {', '.join(profiles)}"
            )
        return requested
    fitting = [(float(p["min_gib"]), name) for name, p in profiles.items() if memory_gib >= float(p["min_gib"])]
    return max(fitting)[1] if fitting else None


def warmup_gpu_overrides(requested: str | None, memory_gib: float) -> tuple[str | None, dict[str, Any]]:
    """For `calcx warmup`: the GPU profile of calcx.yaml that `requested` (auto, none or a name;
    None: calcx.yaml's own `calcx.gpu_profile`, as calcx train reads it) picks for this GPU's
    memory, and its `warmup` settings ({} where it has none)."""
    sections = _load_sections(CALCX_OVERRIDES)
    profiles = sections.get("gpu_profiles") or {}
    setting = "--gpu-profile"
    if requested is None:
        setting = f"{CALCX_OVERRIDES.name} calcx.gpu_profile"
        requested = "auto"
        for section in ("overrides", "additions"):  # applied in this order: the later wins
            value = OmegaConf.select(OmegaConf.create(sections.get(section) or {}), "calcx.gpu_profile")
            requested = requested if value is None else str(value)
    profile = choose_gpu_profile(profiles, requested, memory_gib, setting=setting)
    return profile, (profiles[profile].get("warmup") or {}) if profile is not None else {}


def run_profile_overrides(profiles: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The `overrides` of run profile `name` and of the profiles it `extends`, base first, so that
    a variant of a documented run states only what it changes."""
    chain: list[dict[str, Any]] = []
    seen: list[str] = []
    current: str | None = name
    while current is not None:
        if current not in profiles:
            known = ", ".join(sorted(profiles)) or "none are defined"
            where = f"--profile {name!r}" if current == name else f"run profile {seen[-1]!r} extends {current!r}"
            raise ConfigError(f"{where}: no such run profile in {CALCX_OVERRIDES.name}; known: {known}")
        if current in seen:
            raise ConfigError(f"run profile {name!r}: 'extends' loops ({' -> '.join([*seen, current])})")
        seen.append(current)
        entry = profiles[current] or {}
        if not isinstance(entry, dict) or set(entry) - {"extends", "overrides"}:
            raise ConfigError(f"run profile {current!r}: expected a mapping with 'overrides' (and 'extends')")
        chain.append(entry.get("overrides") or {})
        current = entry.get("extends")
    return chain[::-1]


def _requested_gpu_profile(cfg: DictConfig, dotlist: list[str]) -> str:
    requested = str(cfg.calcx.get("gpu_profile", "auto"))
    for item in dotlist:  # the command line wins; it is applied after the profile
        key, value, _ = parse_dotlist_item(item)
        if key == "calcx.gpu_profile":
            requested = str(value)
    return requested


def parse_dotlist_item(item: str) -> tuple[str, Any, bool]:
    """`key=value` / `+key=value` / `++key=value` -> (key, parsed value, may add a new key)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value (e.g. trainer.total_epochs=1)")
    key, raw = item.split("=", 1)
    add = key.startswith("+")
    key = key.lstrip("+").strip()
    if not key or key.startswith("~"):
        raise ConfigError(f"override {item!r}: key is empty or a deletion, which is not supported")
    try:
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]))
        assert isinstance(parsed, dict)  # the container of a DictConfig
        value = parsed["v"]
    except Exception as exc:  # omegaconf raises grammar errors of several kinds
        raise ConfigError(f"override {item!r}: cannot parse value {raw!r} ({exc})") from exc
    return key, value, add


def _group_names(config_dir: Path) -> set[str]:
    return {p.name for p in config_dir.iterdir() if p.is_dir() and not p.name.startswith("_")}


def compose(request: ComposeRequest) -> DictConfig:
    """verl defaults < calcx.yaml < (async.yaml) < overlays < GPU profile < run profile < flags <
    command-line dotlist."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = verl_config_dir()
    groups = _group_names(config_dir)
    group_overrides: list[str] = []
    dotlist: list[str] = []
    for item in request.dotlist:
        key = item.split("=", 1)[0].lstrip("+")
        (group_overrides if key in groups else dotlist).append(item)

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = hydra_compose(config_name=VERL_CONFIG_NAME, overrides=group_overrides)
    GlobalHydra.instance().clear()

    calcx_sections = _load_sections(CALCX_OVERRIDES)
    _apply_sections(cfg, calcx_sections, str(CALCX_OVERRIDES))
    _set(cfg, "actor_rollout_ref.rollout.agent.default_agent_loop", CALCX_AGENT_LOOP, must_exist=True, origin="calcx")
    _set(
        cfg,
        "actor_rollout_ref.rollout.agent.agent_loop_config_path",
        str(AGENT_LOOPS_FILE),
        must_exist=True,
        origin="calcx",
    )
    if request.async_mode:
        _apply_file(cfg, ASYNC_OVERRIDES)
    for overlay in request.overlays:
        _apply_file(cfg, Path(overlay))

    profiles = calcx_sections.get("gpu_profiles") or {}
    memory = gpu_memory_gib() if request.gpu_memory_gib is None else request.gpu_memory_gib
    profile = choose_gpu_profile(profiles, _requested_gpu_profile(cfg, dotlist), memory)
    if profile is not None:
        _apply_sections(
            cfg,
            {"overrides": profiles[profile].get("overrides") or {}},
            f"{CALCX_OVERRIDES} gpu_profiles.{profile}",
            new_key_hint=profile_new_key_hint(CALCX_OVERRIDES),
        )
    _set(cfg, "calcx.gpu_profile_applied", profile or "none", must_exist=False, origin="calcx")
    _set(cfg, "calcx.gpu_memory_gib", round(memory, 1), must_exist=False, origin="calcx")

    if request.run_profile is not None:
        origin = f"{CALCX_OVERRIDES} run_profiles.{request.run_profile}"
        for overrides in run_profile_overrides(calcx_sections.get("run_profiles") or {}, request.run_profile):
            _apply_sections(cfg, {"overrides": overrides}, origin, new_key_hint=profile_new_key_hint(CALCX_OVERRIDES))
    _set(cfg, "calcx.run_profile_applied", request.run_profile or "none", must_exist=False, origin="calcx")

    flags = {
        "actor_rollout_ref.model.path": request.model,
        "data.train_files": request.train_files,
        "data.val_files": request.val_files,
        "calcx.server_url": request.server_url,
        "trainer.experiment_name": request.run_name,
        "calcx.runner": request.runner,
        GPUS_KEY: request.gpus_per_node,
        NODES_KEY: request.nnodes,
    }
    for dotted, value in flags.items():
        if value is not None:
            _set(cfg, dotted, value, must_exist=True, origin="command line flag")
    new_keys = {RAY_ADDRESS_KEY: request.ray_address, SERVICES_HOST_KEY: request.services_host}
    for dotted, value in new_keys.items():  # a keyword of ray.init verl's schema leaves out; calcx's own
        if value is not None:
            _set(cfg, dotted, value, must_exist=False, origin="command line flag")

    for item in dotlist:
        key, value, add = parse_dotlist_item(item)
        _set(cfg, key, value, must_exist=not add, origin=f"override {item!r}")

    template = request.chat_template if request.chat_template is not None else cfg.calcx.get("chat_template")
    if template:
        apply_chat_template(cfg, str(template))
    check_reward_options(cfg)
    check_scale(cfg)
    agent_tool_rounds(cfg)
    agent_prompt(cfg)
    return cfg


def agent_tool_rounds(cfg: DictConfig) -> int:
    """`calcx.agent_tool_rounds`: the agent's rounds of calculator calls before it must answer (the
    controller's agents get it as CALCX_AGENT_TOOL_ROUNDS; the anchor's turn limits follow it). A
    bad value stops the run at composition, by name."""
    from calcx.contract.env import TOOL_ROUNDS_DEFAULT, parse_tool_rounds

    value = OmegaConf.select(cfg, "calcx.agent_tool_rounds", default=None)
    if value is None:
        return TOOL_ROUNDS_DEFAULT
    try:
        return parse_tool_rounds(value, what="calcx.agent_tool_rounds")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def agent_prompt(cfg: DictConfig) -> str:
    """`calcx.agent_prompt`: the name of the system message the agents open their chat with (the
    controller's agents get it as CALCX_AGENT_PROMPT; the anchor's prompts follow it). A bad name
    stops the run at composition."""
    from calcx.contract.env import AGENT_PROMPT_DEFAULT, parse_agent_prompt

    value = OmegaConf.select(cfg, "calcx.agent_prompt", default=None)
    if value is None:
        return AGENT_PROMPT_DEFAULT
    try:
        return parse_agent_prompt(value, what="calcx.agent_prompt")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_scale(cfg: DictConfig) -> None:
    """GPUs, nodes, replicas and the batch must fit together (calcx.trainer.config.scale): a bad
    split stops the run here, naming the rule, not at verl's first update."""
    try:
        scale_of(cfg)
    except ScaleError as exc:
        raise ConfigError(str(exc)) from None


def check_reward_options(cfg: DictConfig) -> None:
    """`calcx.reward` is read in every agent loop session: a bad value stops the run here, by name."""
    from calcx.trainer.rollouts.reward_options import RewardOptionError, RewardOptions

    section = OmegaConf.select(cfg, "calcx.reward", default=None)
    container = OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else section
    if container is not None and not isinstance(container, dict):
        raise ConfigError(f"calcx.reward must be a mapping of options, not {container!r}")
    try:
        RewardOptions.from_config({str(k): v for k, v in container.items()} if container is not None else None)
    except RewardOptionError as exc:
        raise ConfigError(str(exc)) from None


def resolve_model_path(model: str) -> str:
    """(Checked when a run starts, not by --print-config.) A local model directory becomes absolute (Ray workers and vLLM do not share our cwd) and must
    look like a Hugging Face model; anything else that is not a path is taken as a hub id."""
    path = Path(model).expanduser()
    looks_like_path = model.startswith(("/", "./", "../", "~")) or path.exists()
    if not looks_like_path:
        return model
    if not path.is_dir():
        raise ConfigError(
            f"--model {model!r}: no such directory; give a local model directory "
            "(with config.json and the tokenizer files) or a Hugging Face hub id"
        )
    missing = [name for name in ("config.json",) if not (path / name).is_file()]
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        missing.append("tokenizer.json or tokenizer_config.json")
    if missing:
        raise ConfigError(
            f"--model {model!r}: the directory has no {' and no '.join(missing)}; "
            "it must be a Hugging Face model directory (`calcx model from-gguf` makes one from a GGUF file)"
        )
    return str(path.resolve())


def chat_template_path(spec: str) -> Path:
    """`hermes` (the packaged Hermes tool template) or a path to a Jinja file."""
    path = NAMED_TEMPLATES.get(spec) or Path(spec).expanduser()
    if not path.is_file():
        named = ", ".join(NAMED_TEMPLATES)
        raise ConfigError(f"--chat-template {spec!r}: no such file; give a Jinja chat template file or one of: {named}")
    return path.resolve()


def apply_chat_template(cfg: DictConfig, spec: str) -> None:
    """One template for both sides: vLLM renders the agent's chats with it (`vllm serve
    --chat-template PATH`, through `engine_kwargs.vllm`), verl's tokenizer renders and measures the
    prompts with it (`actor_rollout_ref.model.custom_chat_template`, the template text)."""
    path = chat_template_path(spec)
    text = path.read_text(encoding="utf-8")
    if "{%" not in text and "{{" not in text:
        raise ConfigError(f"--chat-template {spec!r}: {path} does not look like a Jinja template")
    _set(cfg, "calcx.chat_template", str(path), must_exist=False, origin="--chat-template")
    _set(
        cfg,
        "actor_rollout_ref.rollout.engine_kwargs.vllm.chat_template",
        str(path),
        must_exist=False,
        origin="--chat-template",
    )
    _set(cfg, "actor_rollout_ref.model.custom_chat_template", text, must_exist=True, origin="--chat-template")


def _masked(cfg: DictConfig) -> DictConfig:
    """A copy of the config with its secrets masked."""
    shown = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    assert isinstance(shown, DictConfig)  # a mapping's container is one
    for dotted in SECRET_KEYS:
        if _has_key(shown, dotted):
            value = OmegaConf.select(shown, dotted, throw_on_missing=False, default=None)
            masked = "***" if value not in (None, "") else ""
            OmegaConf.update(shown, dotted, masked, merge=False)
    return shown


def config_value(cfg: DictConfig, dotted: str) -> str:
    """One key of the config as a line of text (a section as YAML), its interpolation resolved,
    secrets masked: what a script reads of a composed run (`calcx train --print-key`). ConfigError
    for a key the config does not have."""
    if not _has_key(cfg, dotted):
        raise ConfigError(f"{dotted!r} is not a key of the composed config")
    try:
        value = OmegaConf.select(_masked(cfg), dotted)
        if isinstance(value, DictConfig | ListConfig):
            return OmegaConf.to_yaml(value, resolve=True)
    except OmegaConfBaseException as exc:  # an interpolation that does not resolve
        raise ConfigError(f"{dotted!r}: {exc}") from None
    return f"{value}\n"


def redacted_yaml(cfg: DictConfig) -> str:
    """The config as YAML, interpolations resolved where they can be, secrets masked."""
    shown = _masked(cfg)
    for dotted in LONG_KEYS:
        value = OmegaConf.select(shown, dotted, throw_on_missing=False, default=None)
        if isinstance(value, str) and len(value) > 80:
            OmegaConf.update(shown, dotted, f"<{len(value)} characters, from calcx.chat_template>", merge=False)
    return OmegaConf.to_yaml(shown)
