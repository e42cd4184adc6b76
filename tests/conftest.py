"""What every test directory shares: the `system` marker, which tells system tests (they start
other processes: calcx's parts, the agent, its calculator, containers, a build) from the fast
ones that run inside the test process.

    ./pants test ::                        # everything (CI)
    ./pants test :: -- -m "not system"     # the fast tests alone

The table below marks whole files, so that marking needs no edit inside them; a single test can
carry `@pytest.mark.system` itself. tests/ci/test_ci_test_kinds.py fails when a file that starts
processes is missing from the table.
"""

from __future__ import annotations

import pytest

SYSTEM = "system"

#: Test files (from tests/) that start other processes.
SYSTEM_TEST_FILES = frozenset(
    {
        "agent/test_agent_calculator_death.py",
        "agent/test_agent_calculator_inprocess.py",
        "agent/test_agent_calculator_limits.py",
        "agent/test_agent_rollouts.py",
        "agent/test_agent_run_end.py",
        "ci/test_ci_test_kinds.py",
        "controller/test_controller_cli.py",
        "controller/test_controller_end_to_end.py",
        "controller/test_controller_local_runner.py",
        "controller/test_controller_sandbox.py",
        "data/test_data_hard.py",
        "data/test_data_traces.py",
        "docker/test_docker_agent_container.py",
        "docker/test_image_reproducible.py",
        "faults/test_faults_killed_trainer.py",
        "faults/test_faults_leases.py",
        "faults/test_faults_live.py",
        "faults/test_faults_question_text.py",
        "k8s/test_k8s_controller_process.py",
        "k8s/test_k8s_kind.py",
        "k8s/test_k8s_manifests_schema.py",
        "pants_plugins/test_pants_plugins_import_layers.py",
        "procs/test_procs_dumpable.py",
        "procs/test_procs_managed.py",
        "rehearse/test_rehearse_cli.py",
        "runs/test_runs_traces.py",
        "server/test_server_gateway_replicas.py",
        "server/test_server_restart.py",
        "stub_llm/test_stub_llm_cli.py",
        "trainer/test_anchor_config.py",
        "trainer/test_anchor_parity.py",
        "trainer/test_anchor_tool.py",
        "trainer/test_gpu_run_results.py",
        "trainer/test_gpu_carry.py",
        "trainer/run/test_trainer_scale_flags.py",
        "trainer/run_dir/test_trainer_server_key.py",
        "trainer/run_dir/test_trainer_checkpoints.py",
        "trainer/workers/test_trainer_calcx_agent_loop.py",
        "trainer/run/test_trainer_cli.py",
        "trainer/test_trainer_cpu_build.py",
        "trainer/rollouts/test_trainer_group.py",
        "trainer/run/test_trainer_launch.py",
        "trainer/rollouts/test_trainer_leftovers.py",
        "trainer/rollouts/test_trainer_live_bridge.py",
        "trainer/rollouts/test_trainer_live_join.py",
        "trainer/workers/test_trainer_manager.py",
        "trainer/workers/test_trainer_replay_buffer.py",
        "trainer/run/test_trainer_resume.py",
        "trainer/run/test_trainer_resume_kill.py",
        "trainer/run/test_trainer_run_lease.py",
        "trainer/run/test_trainer_sample_pass.py",
        "trainer/run/test_trainer_services_die_with_trainer.py",
        "trainer/run/test_trainer_services_sandbox.py",
        "worker/test_worker_fork.py",
        "worker/test_worker_restart.py",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{SYSTEM}: starts other processes (calcx's parts, the agent, containers); "
        f"-m 'not {SYSTEM}' runs the fast tests alone",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        relative = "/".join(parts[parts.index("tests") + 1 :]) if "tests" in parts else item.path.name
        if relative in SYSTEM_TEST_FILES:
            item.add_marker(SYSTEM)


_DESELECTED = pytest.StashKey[int]()


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        stash = items[0].config.stash
        stash[_DESELECTED] = stash.get(_DESELECTED, 0) + len(items)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A file whose tests a `-m` expression deselects, all of them, passes: Pants runs each file
    on its own and would count pytest's "no tests ran" as a failure. A file with no tests at all
    still fails."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and session.config.stash.get(_DESELECTED, 0):
        session.exitstatus = pytest.ExitCode.OK
