"""A real Lightning ``Trainer`` under ElasticStrategy in one process (a one-process gloo
group): the assigned batch with accumulation, a stop mid-epoch that checkpoints, acks and
exits, a resume on another batch at the next sample with Lightning's epoch counter, optimizer
and scheduler restored, a rebatch mid-epoch that Lightning's epoch end still sees, and the
completion checkpoint. Lightning is a test dependency (scripts/install.sh installs it)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from sia_slurm.job.elastic import CheckpointManager
from sia_slurm.job.jobenv import JobEnvironment
from sia_slurm.job.runs import training_name
from sia_slurm.protocol import (
    Assignment,
    MetricsReport,
    StatePaths,
    StopRequest,
    read_document,
    write_document,
)
from sia_slurm.safefiles import read_json
from tests import zygote
from tests.job.gloo import run_ranks

# Lightning's import comes with fit, when a test runs (tests/job/lightning_fit.py); the size of
# its dataset (lightning_fit.SIZE: every test here checks each sample was seen once)
SIZE = 40


def fit(env: JobEnvironment, epochs: int, after: Any = None, signals: bool = False) -> Any:
    from tests.job import lightning_fit

    return lightning_fit.fit(env, epochs, after, signals)


@pytest.mark.xdist_group("lightning")  # one worker imports Lightning
def test_a_lightning_trainer_stops_resumes_on_another_batch_and_rebatches(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env(batch_size=8, local_bsz=4, accum_steps=1, init_batch_size=8, linger_s=0.1)
    paths = StatePaths(env.state_dir)

    def request_stop(module: Any) -> None:
        if module.job.step == 2:  # obeyed after step 3 (index 2), mid-epoch
            write_document(paths.stop_request(env.sia_id), StopRequest(env.sia_id, 2))

    with pytest.raises(SystemExit) as stopped:
        fit(env, 3, after=request_stop)
    assert stopped.value.code == 0
    assert paths.ack(env.sia_id, 2, "7", 0).exists()
    first = torch.load(next((env.checkpoint_dir).glob("ckpt-0000000003.pt")), weights_only=True)
    assert first["sampler"]["position"] == 24 and first["format"] == 2
    assert read_json(paths.job_dir(env.sia_id) / training_name("7", 0))["end"] == "stopped"
    # Lightning's optimizer steps: 3 of 2 micro-batches each; its scheduler did not step yet
    assert first["optimizer"]["state"][0]["momentum_buffer"].abs().sum() > 0
    assert first["scheduler"]["last_epoch"] == 0

    second_env = make_env(
        batch_size=16, local_bsz=8, accum_steps=1, init_batch_size=8, launch_round=2, restarts=1
    )

    def rebatch(module: Any) -> None:
        if module.job.step == 5:  # after epoch 1's first step; adopted after its second
            write_document(
                paths.assignment(env.sia_id),
                Assignment(env.sia_id, 3, "a100", "dgx", 1, 1, (), 4, 4, 0, 1, "7", 1),
            )

    job, module = fit(second_env, 3, after=rebatch)
    assert job.restored_step == 3 and job.completed
    assert job.round == 3 and job.batch.batch_size == 4
    # epoch 0's last 16 samples, epoch 1: 2 steps at 16, 2 at 4 (Lightning counts 6 batches,
    # not the 5 it planned), epoch 2: 10 at 4; every sample once
    assert sum(v for (e, _), v in module.seen.items() if e == 0) == 16
    assert all(v == 1 for v in module.seen.values())
    assert {i for (e, i) in module.seen if e == 1} == set(range(SIZE))
    assert {i for (e, i) in module.seen if e == 2} == set(range(SIZE))
    assert job.step == 3 + 1 + 2 + 2 + 10
    last = torch.load(env.checkpoint_dir / f"ckpt-{job.step:010d}.pt", weights_only=True)
    assert last["scheduler"]["last_epoch"] == 3  # stepped at the end of each epoch
    assert last["sampler"]["epoch"] == 2 and last["sampler"]["position"] == SIZE
    assert read_json(paths.job_dir(env.sia_id) / training_name("7", 1))["end"] == "completed"
    assert job.noise.known  # the comm hook's statistics reached the job


@pytest.mark.xdist_group("lightning")  # one worker imports Lightning
def test_sigterm_under_lightning_checkpoints_after_the_step(make_env) -> None:  # type: ignore[no-untyped-def]
    """Lightning installs its own SIGTERM handler (it would raise at the next batch); the job's
    takes it back: the step in flight completes, then a checkpoint and exit 0."""
    env = make_env(batch_size=8, local_bsz=4, accum_steps=1, init_batch_size=8)
    before = signal.getsignal(signal.SIGTERM)

    def terminate(module: Any) -> None:
        if module.job.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        with pytest.raises(SystemExit) as ended:
            fit(env, 2, after=terminate, signals=True)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert ended.value.code == 0
    assert CheckpointManager(env.checkpoint_dir).steps() == [3]
    paths = StatePaths(env.state_dir)
    assert read_json(paths.job_dir(env.sia_id) / training_name("7", 0))["end"] == "terminated"


@pytest.mark.heavy
def test_the_lightning_example_trains_two_gloo_replicas(tmp_path: Path, make_env) -> None:  # type: ignore[no-untyped-def]
    """sia_slurm/job/examples/lightning_elastic.py as torchrun would start it for 2 GPUs: the two
    ranks train disjoint halves of every epoch with accumulation, DDP's communication hook
    gives the controller noise statistics, and the job completes with its checkpoint."""
    env = make_env(gpus=2, batch_size=16, local_bsz=4, accum_steps=1, init_batch_size=8)
    command = [
        sys.executable, "-m", "sia_slurm.job.examples.lightning_elastic", "--epochs", "2",
        "--dataset-size", "48", "--workers", "0", "--sample-log", str(tmp_path / "log"),
    ]  # fmt: skip
    preload = (*zygote.TORCH, "lightning.pytorch")
    assert run_ranks(command, env, 180, preload=preload) == [0, 0]
    rows = [
        (rank, json.loads(line))
        for rank in range(2)
        for line in (tmp_path / "log" / f"samples-r{rank}.jsonl").read_text().splitlines()
    ]
    for epoch in range(2):
        per_rank = [
            [i for r, row in rows if r == rank and row["epoch"] == epoch for i in row["indices"]]
            for rank in range(2)
        ]
        assert sorted(per_rank[0] + per_rank[1]) == list(range(48))  # each sample once
        assert len(per_rank[0]) == len(per_rank[1]) == 24
    assert {row["accum_steps"] for _, row in rows} == {1}
    assert CheckpointManager(env.checkpoint_dir).steps()[0] == 6  # 2 epochs x 48 / 16
    report = read_document(MetricsReport, StatePaths(env.state_dir).metrics(env.sia_id))
    assert report.steps == 6 and report.grad_var > 0  # (grad_sqr may be clipped at 0)
