"""Run one `calcx train`: rollout services, verl (or the eval-only driver), then the run report.

Order: Calc-X files -> verl's layout, and every value the run adds to its config resolved
(calcx.trainer.run.run_settings); the calcx server + controller are started (unless
`calcx.server_url` names running ones); the run's values, with the server's URL and key file,
written into the config in one step; verl's own checks; verl's V1 trainer, with a progress line a
step on the console and the curve redrawn at each validation (calcx.trainer.run.progress). Whatever
happens, the validation rollouts are read back from the server and `eval.md`, `reward_curve.png`
and `report.md` are written, then every process this run started is ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from calcx.contract.env import CALCX_KEY
from calcx.trainer.config.scale import RAY_ADDRESS_ENV, ray_cluster_address, services_host
from calcx.trainer.run.data import Sources
from calcx.trainer.run.progress import ProgressWatch, total_training_steps
from calcx.trainer.run.report import count_incomplete, write_report
from calcx.trainer.run.resume import ResumeStart, settle_previous_run, start_resume
from calcx.trainer.run.run_settings import RunSettings, prepare_run
from calcx.trainer.run.services import LocalServices, ServicesConfig
from calcx.trainer.run_dir.names import INCOMPLETE_GROUPS_FILE, SERVICES_DIR
from calcx.trainer.run_dir.server_key import key_dir, remove_key_file, write_key_file

log = logging.getLogger(__name__)


class LaunchError(RuntimeError):
    """The run cannot start as configured; the message says what to change."""


def check_batch_shape(cfg: DictConfig) -> None:
    """The checks verl skips once micro-batches are cut by tokens (`use_dynamic_bsz`): a mini batch
    no larger than the train batch (verl pads a step's rows to a multiple of mini batch x n), and a
    token budget that holds the longest row (else verl stops at the first old-log-prob pass)."""
    actor = cfg.actor_rollout_ref.actor
    if actor.ppo_mini_batch_size > cfg.data.train_batch_size:
        raise ValueError(
            f"actor_rollout_ref.actor.ppo_mini_batch_size ({actor.ppo_mini_batch_size}) must be <= "
            f"data.train_batch_size ({cfg.data.train_batch_size})"
        )
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    if actor.use_dynamic_bsz and actor.ppo_max_token_len_per_gpu < longest:
        raise ValueError(
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu ({actor.ppo_max_token_len_per_gpu}) must hold "
            f"the longest row, data.max_prompt_length + data.max_response_length ({longest}); raise it"
        )


def validate_with_verl(cfg: DictConfig) -> None:
    """verl's own checks, as verl.trainer.main_ppo runs them, plus its dataclass conversions."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    check_batch_shape(cfg)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    omega_conf_to_dataclass(cfg.algorithm)


def preflight(server_url: str, key: str) -> None:
    """An external calcx server must answer, and accept the key, before Ray and vLLM start."""
    from calcx.api.client import AsyncCalcxClient, CalcxAPIError

    async def probe() -> None:
        client = AsyncCalcxClient(server_url, key, timeout=10.0)
        try:
            await client.list_rollouts(limit=1)
        finally:
            await client.aclose()

    try:
        asyncio.run(probe())
    except CalcxAPIError as exc:
        hint = (
            "check --agl-key-file / $CALCX_KEY (the key the server was started with)"
            if exc.status in (401, 403)
            else "check --agl-base-url, or leave it out to let calcx train start a server"
        )
        raise LaunchError(f"calcx server at {server_url} is not usable: {exc}; {hint}") from exc


def _settle_run(
    run: str, server_url: str, key: str, resume: Callable[[], ResumeStart] | None, owner: str
) -> ResumeStart | None:
    """Once this start holds its run's lease: plan the resume (checkpoint, report rows), then cancel
    what an earlier run of the same name left (a killed trainer's QUEUED and RUNNING rollouts), so
    that it neither runs first nor is trained; with a resume plan, also roll back the training
    ledger after its checkpoint and say where it starts."""
    from calcx.trainer.rollouts.leftovers import cancel_previous_run

    plan = resume() if resume is not None else None
    if plan is not None:
        settle_previous_run(server_url, key, plan, owner)
        return plan
    if run:
        cancel_previous_run(server_url, key, run, owner)
    return None


def stop_taken_over(message: str) -> None:
    """A run taken over by another trainer: this one stops (as on Ctrl-C), its services with it."""
    import _thread

    print(f"calcx train: stopping: another trainer took this run over ({message})", flush=True)
    _thread.interrupt_main()


@contextlib.contextmanager
def held_run(
    run: str, wait_s: float, server_url: str, key: str, owner: str, take_over: bool, on_lost: Callable[[str], None]
) -> Iterator[None]:
    """The run's lease (calcx.trainer.run.run_lease) for the block, renewed while it runs and released
    after; nothing without a run name (nothing of the run is touched then)."""
    from calcx.api.client import CalcxClient
    from calcx.trainer.run.run_lease import LeaseKeeper, RunLeaseRefused, take_run_lease

    if not run:
        yield
        return
    with CalcxClient(server_url, key, timeout=30.0) as client:
        try:
            lease = take_run_lease(client, run, owner, take_over=take_over, wait_s=wait_s)
        except RunLeaseRefused as exc:
            raise LaunchError(str(exc)) from None
        keeper = LeaseKeeper(client, lease, on_lost).start()
        try:
            yield
        finally:
            keeper.stop()


@dataclass(frozen=True)
class RolloutServer:
    """The calcx server a run's rollouts go to: `url` None for the configured one (`calcx.server_url`),
    and the owner-only file that holds its key (never the key: see server_key), which Ray workers read."""

    key_file: Path
    url: str | None = None
    #: what this start continues from (None: --eval-only), settled once it held the run's lease
    plan: ResumeStart | None = None
    #: the owner id of the run's lease this process holds (its ledger writes name it)
    owner: str = ""
    #: the Ray cluster the run joins (None: a Ray of verl's own on this machine); its workers then
    #: read the key from CALCX_KEY on their own nodes
    cluster: str | None = None


def ray_cluster(cfg: DictConfig) -> str | None:
    """The Ray cluster the run joins (None: verl starts one here); several nodes need one."""
    cluster = ray_cluster_address(cfg, os.environ)
    nodes = int(cfg.trainer.nnodes)
    if cluster is None and nodes > 1:
        raise LaunchError(
            f"trainer.nnodes={nodes}: several nodes train on a running Ray cluster; pass --ray-address "
            f"ADDR (or start calcx train with ray job submit, which sets {RAY_ADDRESS_ENV})"
        )
    return cluster


def cluster_key(key: str) -> str:
    """On a Ray cluster the workers of every node read the key from their own CALCX_KEY, so the
    server calcx train starts must run with that key, not one made for the run."""
    if not key:
        raise LaunchError(
            f"on a Ray cluster the Ray workers read the calcx server's key from {CALCX_KEY} on their nodes, and "
            f"the server calcx train starts must use the same key: set {CALCX_KEY} (or --agl-key-file) to it"
        )
    return key


def server_args(cfg: DictConfig, given: Sequence[str]) -> list[str]:
    """The started server's flags: `calcx.server_args`, then what the run's settings decide unless
    given there: the max_tokens ceiling (what verl trains on, so no recorded answer is cut later) and
    the model servers' tool-call parser (the gateway then sends earlier turns back as the model wrote
    them, calcx.server.assistant_turns)."""
    args = list(given)
    if "--max-tokens-ceiling" not in args:
        args += ["--max-tokens-ceiling", str(int(cfg.actor_rollout_ref.rollout.response_length))]
    parser = OmegaConf.select(cfg, "actor_rollout_ref.rollout.engine_kwargs.vllm.tool_call_parser", default=None)
    if parser and "--tool-call-parser" not in args:
        args += ["--tool-call-parser", str(parser)]
    return args


def _key_home(report_dir: Path, cluster: str | None) -> Path | None:
    """Where the driver keeps the key file: the run directory, or, on a Ray cluster (whose run
    directory is storage every node mounts, and whose workers read the key from their node's
    CALCX_KEY), a new owner-only directory of this node's own."""
    return None if cluster is not None else key_dir(report_dir)


@contextlib.contextmanager
def rollout_services(
    cfg: DictConfig,
    report_dir: Path,
    key: str = "",
    resume: Callable[[], ResumeStart] | None = None,
    *,
    owner: str = "",
    take_over: bool = False,
    on_lost: Callable[[str], None] = stop_taken_over,
) -> Iterator[RolloutServer]:
    """Start the server and controller unless `calcx.server_url` is set (then `key` is its key);
    take the run's lease (`owner`, `take_over`) before anything of the run is touched, then
    `resume` (the resume plan) and the previous run's leftovers; say where they are. The config is
    not changed here (RunSettings.with_server writes it)."""
    from calcx.trainer.run.run_lease import DEFAULT_WAIT_S, new_owner

    owner = owner or new_owner()
    run = str(cfg.calcx.get("run") or "")
    wait_s = float(cfg.calcx.get("run_lease_wait_s", DEFAULT_WAIT_S)) if run else 0.0
    cluster = ray_cluster(cfg)
    if cfg.calcx.get("server_url"):
        url = str(cfg.calcx.server_url)
        preflight(url, key)
        with held_run(run, wait_s, url, key, owner, take_over, on_lost):
            plan = _settle_run(run, url, key, resume, owner)
            key_file = write_key_file(key, _key_home(report_dir, cluster))
            try:
                yield RolloutServer(key_file=key_file, plan=plan, owner=owner, cluster=cluster)
            finally:
                remove_key_file(key_file)
        return
    try:
        config = ServicesConfig.from_calcx_section(cfg.calcx, report_dir / SERVICES_DIR)
        config.host = services_host(cfg.calcx, cluster)
    except ValueError as exc:
        raise LaunchError(str(exc)) from exc
    if cluster is not None:
        config.key = cluster_key(key)
    config.server_args = server_args(cfg, config.server_args)
    services = LocalServices(config)
    key_file = write_key_file(services.key, _key_home(report_dir, cluster))
    try:
        services.start_server()
        # the lease before the controller: a second start of a live run claims none of its work
        with held_run(run, wait_s, services.server_url, services.key, owner, take_over, on_lost):
            services.start_controller()
            log.info(
                "calcx train: server %s and controller started (logs in %s)", services.server_url, services.workdir
            )
            plan = _settle_run(run, services.server_url, services.key, resume, owner)
            yield RolloutServer(key_file=key_file, url=services.server_url, plan=plan, owner=owner, cluster=cluster)
    finally:
        services.stop()
        remove_key_file(key_file)


def register_endpoint(settings: RunSettings, endpoint: str) -> None:
    """`--model-endpoint`: an OpenAI-compatible server (vLLM, the stub) plays the policy."""
    from calcx.trainer.workers.replicas import register_replicas

    register_replicas(settings.server_url, settings.server_key(), settings.model_path, [endpoint], policy_version=0)


def run_verl(cfg: DictConfig) -> None:
    validate_with_verl(cfg)
    from verl.trainer.main_ppo import run_ppo

    from calcx.trainer.workers.task_runner import CalcxTaskRunner

    run_ppo(cfg, task_runner_class=CalcxTaskRunner)


def run_eval_driver(cfg: DictConfig, val_src: Sources) -> dict[str, int]:
    """Validation only, without verl: each row through the AgentLoop's session path."""
    from calcx.trainer.run.data import read_sources
    from calcx.trainer.run.evaluation import run_validation

    rows = read_sources(val_src)
    return asyncio.run(
        run_validation(cfg, rows, step=0, groups_in_flight=int(cfg.calcx.get("controller_concurrency") or 32))
    )


def finish_report(settings: RunSettings, title: str) -> Path:
    """Read the last validation step back from the server and write eval.md, reward_curve.png, report.md."""
    from calcx.trainer.run.evaluation import collect_eval

    collection = collect_eval(settings.server_url, settings.server_key())
    report_dir = settings.report_dir
    return write_report(
        report_dir,
        metrics_path=settings.metrics_path,
        eval_records=collection.records,
        incomplete_groups=count_incomplete(report_dir / INCOMPLETE_GROUPS_FILE),
        allow_no_reward=True,
        eval_note=collection.note(),
        title=title,
    )


def run_training(
    cfg: DictConfig,
    *,
    train_src: Sources,
    val_src: Sources,
    eval_only: bool = False,
    model_endpoint: str | None = None,
    key: str = "",
    take_over: bool = False,
) -> int:
    """Train (or, with `eval_only`, only validate) and write the report; 0 when both succeeded.
    `take_over`: take the run from another trainer holding its lease (which is then fenced off)."""
    settings = prepare_run(
        cfg, train_src=train_src, val_src=val_src, validate_only=eval_only and model_endpoint is None
    )
    report_dir, metrics_path = settings.report_dir, settings.metrics_path
    # a training run continues from its newest whole checkpoint (docs/resume.md), chosen once the
    # run's lease is held: a second start of a live run must not move its files
    resume = None if eval_only else (lambda: start_resume(cfg, report_dir))
    with rollout_services(cfg, report_dir, key, resume, take_over=take_over) as server:
        settings = settings.with_server(
            server.key_file, server.url, server.owner, key_from_env=server.cluster is not None
        )
        settings.apply(cfg)  # what verl and its workers read; the driver keeps using `settings`

        def run() -> None:
            if model_endpoint is not None:
                register_endpoint(settings, model_endpoint)
                counts = run_eval_driver(cfg, val_src)
                log.info("calcx train --eval-only: %s", counts)
            else:
                watch = ProgressWatch(metrics_path, report_dir, total_steps=training_steps(cfg))
                with watch.running():  # one console line a step, the curve redrawn at each validation
                    run_verl(cfg)

        def report() -> str:
            written = finish_report(settings, f"Calc-X run {cfg.trainer.experiment_name}")
            return f"report in {written} (eval table {report_dir / 'eval.md'})"

        run_then_report("calcx train", run, report)
    return 0


def training_steps(cfg: DictConfig) -> int | None:
    """The number of steps verl will train, from the verl-layout train file's rows (None when unknown)."""
    import pyarrow.parquet as pq

    try:
        rows = pq.ParquetFile(str(cfg.data.train_files)).metadata.num_rows
    except (OSError, ValueError):
        return None
    return total_training_steps(cfg, rows)


def run_then_report(prog: str, run: Callable[[], object], report: Callable[[], str]) -> None:
    """`run`, then `report` (printed after `prog: `) even when the run failed or was interrupted;
    a report that fails after a failed run is logged, so the run's own error is the one raised."""
    failure: BaseException | None = None
    try:
        run()
    except BaseException as exc:
        failure = exc
    try:
        print(f"{prog}: {report()}", flush=True)
    except Exception as exc:
        if failure is None:
            raise
        log.error("%s: could not write the report after the run failed: %s", prog, exc)
    if failure is not None:
        raise failure
