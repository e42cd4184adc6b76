"""Where a started run continues: verl is told the newest whole checkpoint (never its own tracker),
or to start fresh; half-written step directories after it go; the report's step files keep the
rows through the checkpoint's step and set the later ones aside; `calcx train` says all of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from live_stack import needs_services, start_server

from calcx.api.client import CalcxClient
from calcx.contract.labels import RUN_LABEL
from calcx.trainer.config.compose import ComposeRequest, compose
from calcx.trainer.run.launch import rollout_services
from calcx.trainer.run.resume import start_resume, supersede_rows
from calcx.trainer.run_dir.checkpoints import write_marker
from calcx.trainer.run_dir.names import STARTS_FILE, SUPERSEDED_DIR


def _cfg(tmp_path: Path, *dotlist: str):
    return compose(
        ComposeRequest(
            model="calcx-stub",
            run_name="r1",
            gpu_memory_gib=0,
            dotlist=[f"trainer.default_local_dir={tmp_path / 'ckpt'}", *dotlist],
        )
    )


def _save(root: Path, step: int, *, whole: bool) -> Path:
    folder = root / f"global_step_{step}"
    (folder / "actor").mkdir(parents=True)
    (folder / "data.pt").write_bytes(b"d")
    if whole:
        write_marker(folder, step, 0.5)
    return folder


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_named_run_resumes_from_its_newest_whole_checkpoint(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    assert cfg.trainer.resume_mode == "auto" and cfg.trainer.val_before_train
    root = tmp_path / "ckpt"
    _save(root, 2, whole=True)
    chosen = _save(root, 4, whole=True)
    _save(root, 6, whole=False)  # killed while saving
    (root / "latest_checkpointed_iteration.txt").write_text("")
    plan = start_resume(cfg, tmp_path / "report")
    assert (plan.run, plan.step, plan.checkpoint.path) == ("r1", 4, chosen)  # type: ignore[union-attr]
    assert (cfg.trainer.resume_mode, cfg.trainer.resume_from_path) == ("resume_path", str(chosen))
    assert cfg.trainer.default_local_dir == str(root) and not cfg.trainer.val_before_train
    assert plan.removed == [root / "global_step_6"] and not (root / "global_step_6").exists()
    assert (root / "global_step_2").exists()
    # each start says where it begins, a fresh one too (the step table leaves a restart's first step out)
    fresh = start_resume(_cfg(tmp_path, "trainer.resume_mode=disable"), tmp_path / "report")
    assert fresh.step == 0
    assert [(s["first_step"], s["checkpoint"]) for s in _lines(tmp_path / "report" / STARTS_FILE)] == [
        (5, str(chosen)),
        (1, None),
    ]
    plan.cancelled, plan.rolled_back = 3, [5, 6]
    assert plan.summary() == (
        f"resuming run 'r1' after step 4 from checkpoint {chosen}; 3 rollout attempt(s) the previous run left "
        "queued or running cancelled, 0 adopted (re-run steps draw new groups); training records of step(s) 5-6 "
        "rolled back; half-written checkpoint(s) removed: global_step_6"
    )


def test_without_a_whole_checkpoint_the_run_starts_fresh_and_verl_never_reads_its_tracker(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    _save(tmp_path / "ckpt", 2, whole=False)
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("2")
    report = tmp_path / "report"
    report.mkdir()
    (report / "metrics.jsonl").write_text('{"step": 0, "data": {}}\n{"step": 1, "data": {}}\n')
    plan = start_resume(cfg, report)
    assert plan.checkpoint is None and cfg.trainer.resume_mode == "disable" and cfg.trainer.val_before_train
    assert plan.summary().startswith(f"starting run 'r1' at step 1 (no complete checkpoint under {tmp_path / 'ckpt'})")
    assert (report / "metrics.jsonl").read_text() == ""  # a fresh start: the old run's rows set aside
    assert [m["step"] for m in _lines(report / SUPERSEDED_DIR / "metrics.jsonl")] == [0, 1]


def test_verls_other_resume_modes_are_kept(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    older, newer = _save(root, 2, whole=True), _save(root, 4, whole=True)
    cfg = _cfg(tmp_path, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={older}")
    plan = start_resume(cfg, tmp_path / "report")
    assert plan.step == 2 and cfg.trainer.resume_from_path == str(older) and newer.exists()  # a whole one stays
    cfg = _cfg(tmp_path, "trainer.resume_mode=disable")
    assert start_resume(cfg, tmp_path / "report").checkpoint is None and cfg.trainer.resume_mode == "disable"


def test_an_asynchronous_save_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="async_save"):
        start_resume(_cfg(tmp_path, "actor_rollout_ref.actor.checkpoint.async_save=true"), tmp_path)


@pytest.mark.parametrize(
    "setting",
    [
        "trainer.max_actor_ckpt_to_keep=1",
        "trainer.max_critic_ckpt_to_keep=2",
        "+trainer.remove_previous_ckpt_in_save=true",
        "calcx.keep_checkpoints=0",
        "calcx.keep_checkpoints=two",
    ],
)
def test_checkpoint_retention_other_than_calcxs_own_is_refused_before_anything_starts(
    tmp_path: Path, setting: str
) -> None:
    with pytest.raises(ValueError, match="keep_checkpoints"):
        start_resume(_cfg(tmp_path, setting), tmp_path)


def test_the_default_keeps_two_whole_checkpoints(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    assert cfg.calcx.keep_checkpoints == 2
    start_resume(cfg, tmp_path)  # accepted as it is


def test_rows_after_the_checkpoint_are_set_aside_not_lost(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "data": {"x": s}}) + "\n" for s in (0, 1, 2, 3, 4, 3))
    )
    (tmp_path / "tool_use.jsonl").write_text(
        '{"partition": "train", "step": 2}\n{"partition": "val", "step": 5}\n' "not json\n"
    )
    assert supersede_rows(tmp_path, 2) == {"metrics.jsonl": 3, "tool_use.jsonl": 1}
    assert [m["step"] for m in _lines(tmp_path / "metrics.jsonl")] == [0, 1, 2]
    assert [m["step"] for m in _lines(tmp_path / SUPERSEDED_DIR / "metrics.jsonl")] == [3, 4, 3]
    assert (tmp_path / "tool_use.jsonl").read_text() == '{"partition": "train", "step": 2}\nnot json\n'
    assert supersede_rows(tmp_path, 2) == {"metrics.jsonl": 0, "tool_use.jsonl": 0}  # a second start moves nothing


KEY = "resume-test-key-0123456789abcdef0123456"


@needs_services
def test_calcx_train_settles_the_previous_run_on_the_server_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, url = start_server(tmp_path, KEY)
    try:
        with CalcxClient(url, KEY) as client:
            client.create_rollouts(
                [
                    {"rollout_id": rid, "row": {"question": "1+1", "result": "2"}, "labels": {RUN_LABEL: "r1"}}
                    for rid in ("s3", "s5", "s6-queued")
                ]
            )
            for claim in client.claim("dead-controller", 2, timeout_s=2).claims:
                client.post_reward(claim.rollout.rollout_id, claim.attempt_id, 1.0)
                client.finish(claim.rollout.rollout_id, claim.attempt_id, "SUCCEEDED")
            client.record_trained("r1", 3, ["s3"])
            client.record_trained("r1", 5, ["s5"])
            cfg = _cfg(tmp_path, f"calcx.server_url={url}")
            _save(tmp_path / "ckpt", 4, whole=True)
            with rollout_services(cfg, tmp_path / "report", KEY, lambda: start_resume(cfg, tmp_path / "report")) as run:
                plan = run.plan
                assert plan is not None
            assert (client.get_rollout("s6-queued").state, plan.cancelled, plan.rolled_back) == ("FAILED", 1, [5])
            assert client.record_trained("r1", 5, ["s5"]) == 1  # step 5 is trained again, once
    finally:
        server.stop()
    out = capsys.readouterr().out
    assert (
        f"calcx train: resuming run 'r1' after step 4 from checkpoint {tmp_path / 'ckpt' / 'global_step_4'}; 1 "
        "rollout attempt(s) the previous run left queued or running cancelled" in out
    )
    assert "training records of step(s) 5 rolled back" in out
