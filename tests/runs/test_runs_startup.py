"""A run's start-up phases from its train.log (`calcx runs startup`): the committed 2026-12-03 logs,
hand-checked against their timestamped lines, and a log with calcx's own boundary lines and vLLM's
INFO lines, which those runs did not keep."""

from __future__ import annotations

from pathlib import Path

import pytest

from calcx.cli import main
from calcx.runs import startup
from calcx.trainer.run.progress import FIRST_STEP, VALIDATED, VERL_STARTING, phase_line

RUNS = Path(__file__).resolve().parents[2] / "results" / "runs"
VLLM_PHASE = "vLLM replicas (weights, torch.compile, CUDA graphs), reward loop, weight sync"


@pytest.mark.parametrize(
    "run,expected",
    [
        # Ray 14:15:25.938, worker group 14:16:02.932, actor 14:16:27.414, ready to fit 14:18:04.552
        (
            "2026-12-03-gsm8k-h200",
            {
                "verl's data and workers": 36.994,
                "FSDP actor init": 24.482,
                VLLM_PHASE: 97.138,
                "Ray started to ready to fit": 158.614,
            },
        ),
        # Ray 14:05:50.224, worker group 14:06:27.347, actor 14:06:45.126, ready to fit 14:08:21.612
        (
            "2026-12-03-gsm8k-h200-calculator",
            {
                "verl's data and workers": 37.123,
                "FSDP actor init": 17.779,
                VLLM_PHASE: 96.486,
                "Ray started to ready to fit": 151.388,
            },
        ),
    ],
)
def test_the_committed_runs_start_up_phases(run: str, expected: dict[str, float]) -> None:
    measured = dict(startup.phases((RUNS / run / "train.log").read_text()))
    for name, seconds in expected.items():
        assert measured[name] == pytest.approx(seconds, abs=1e-3), name
    # these logs have no calcx boundary lines: Ray's start, the first validation and step are unmeasured
    assert measured["Ray"] is None and measured["first validation"] is None
    assert not {name for name, _ in startup.VLLM_MEASURES} & set(measured)  # the vLLM server kept only warnings


SYNTHETIC = "\n".join(
    [
        "calcx train: starting run 'sync' at step 1",
        phase_line(VERL_STARTING, now=1_796_307_300.0),  # 14:15:00
        "2026-12-03 14:15:25,500\tINFO worker.py:2029 -- Started a local Ray instance.",
        "(CalcxTaskRunnerBase pid=1) INFO:2026-12-03 14:16:00,000:create worker group dict_keys(['actor_rollout'])",
        "(CalcxTaskRunnerBase pid=1) INFO:2026-12-03 14:16:20,250:actor and ref model engine initialized",
        "(vLLMHttpServer pid=2) (Worker pid=3) INFO 12-03 14:16:40 [default_loader.py:291] Loading weights took 1.25 seconds",
        "(vLLMHttpServer pid=2) (Worker pid=3) INFO 12-03 14:17:10 [monitor.py:34] torch.compile takes 30.5 s in total",
        "(vLLMHttpServer pid=2) (Worker pid=3) INFO 12-03 14:17:20 [gpu_model_runner.py:4810] Graph capturing finished in 4 secs",
        "(CalcxTaskRunnerBase pid=1) INFO:2026-12-03 14:18:00,250:all initialize finished, ready to fit",
        "calcx train: step 0/20 | before training | val acc 0.250",
        phase_line(VALIDATED, now=1_796_307_560.0),  # 14:19:20, said after step 0's line
        phase_line(FIRST_STEP, now=1_796_307_575.0),  # 14:19:35
    ]
)


def test_calcx_s_lines_and_vllm_s_measures_complete_the_start_up(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    measured = dict(startup.phases(SYNTHETIC))
    assert measured == pytest.approx(
        {
            "Ray": 25.5,
            "verl's data and workers": 34.5,
            "FSDP actor init": 20.25,
            VLLM_PHASE: 100.0,
            "first validation": 79.75,
            "first step (and its metrics line)": 15.0,
            "Ray started to ready to fit": 154.75,
            "verl starting to first step": 275.0,
            "vLLM weights load": 1.25,
            "vLLM torch.compile": 30.5,
            "vLLM CUDA graph capture": 4.0,
        }
    )
    log = tmp_path / "sync" / "train.log"
    log.parent.mkdir()
    log.write_text(SYNTHETIC)
    assert main(["runs", "startup", str(log), f"older={RUNS / '2026-12-03-gsm8k-h200' / 'train.log'}"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "| phase | sync | older |"
    assert "| first validation | 79.8 | - |" in printed and "| FSDP actor init | 20.2 | 24.5 |" in printed


def test_a_run_without_a_validation_before_training_goes_from_ready_to_fit_to_its_first_step() -> None:
    """The 2026-12-04 calculator-steps run (trainer.val_before_train=false): verl starting
    01:42:07, ready to fit 01:46:10.617, first step logged 01:47:10."""
    measured = dict(startup.phases((RUNS / "2026-12-04-gsm8k-h200-calculator-steps" / "train.log").read_text()))
    assert measured["first validation"] is None
    assert measured["first step (and its metrics line)"] == pytest.approx(59.383, abs=1e-3)
    assert measured["verl starting to first step"] == pytest.approx(303.0)
    assert measured["Ray"] == pytest.approx(17.7, abs=0.05)
