"""The elastic loop in one process: stop, terminate, restore, rebatch, and the noise estimate
with gradient accumulation checked against a direct computation."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from sia_slurm.job.elastic import ElasticTrainer, JobEnvironment, TrainerError
from sia_slurm.protocol import Assignment, MetricsReport, StatePaths, StopRequest, read_document
from sia_slurm.protocol import write_document as write

SIZE = 40


def dataset() -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(SIZE, 4, generator=gen)
    return TensorDataset(x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1)


def make_trainer(env: JobEnvironment, **kwargs: object) -> ElasticTrainer:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    options: dict[str, object] = {"install_signal_handlers": False, "lr_scaling": "none"}
    options.update(kwargs)
    return ElasticTrainer(model, optimizer, dataset(), env=env, **options)  # type: ignore[arg-type]


def train(trainer: ElasticTrainer, epochs: int, seen: Counter[tuple[int, int]], after=None):  # type: ignore[no-untyped-def]
    """Run the loop, counting (epoch, index) pairs; ``after(step)`` runs after each step."""
    for _ in trainer.epochs(epochs):
        for step in trainer.steps():
            for x, y in step.micro_batches():
                step.backward(F.mse_loss(trainer.model(x).squeeze(1), y))
            step.finish()
            seen.update((step.epoch, i) for m in step.plan.micro_batches for i in m)
            if after is not None:
                after(step)


def exactly_once(seen: Counter[tuple[int, int]], epochs: int) -> bool:
    return seen == Counter((e, i) for e in range(epochs) for i in range(SIZE))


def test_training_completes_with_a_final_checkpoint_and_report(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env()
    trainer = make_trainer(env)
    seen: Counter[tuple[int, int]] = Counter()
    train(trainer, 2, seen)
    assert exactly_once(seen, 2)
    assert trainer.step == 2 * SIZE // 8
    assert trainer.checkpoints.steps() == [10]
    report = read_document(MetricsReport, StatePaths(env.state_dir).metrics(env.sia_id))
    assert (report.steps, report.local_bsz, report.accum_steps) == (10, 4, 1)
    assert report.step_time > report.sync_time >= 0
    assert trainer.noise.known  # 2 micro-batches per step: estimated every step


def test_stop_request_checkpoints_acknowledges_lingers_and_exits(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env(launch_round=1, linger_s=0.3)
    paths = StatePaths(env.state_dir)
    trainer = make_trainer(env)
    seen: Counter[tuple[int, int]] = Counter()

    def request_stop(step) -> None:  # type: ignore[no-untyped-def]
        if trainer.step == 3:
            write(paths.stop_request(env.sia_id), StopRequest(env.sia_id, 2))

    with pytest.raises(SystemExit) as stopped:
        train(trainer, 5, seen, after=request_stop)
    assert stopped.value.code == 0
    # the request was seen at step 4's agreement; nothing trained after it
    assert trainer.step == 4 and sum(seen.values()) == 4 * 8
    assert paths.ack(env.sia_id, 2, env.slurm_job_id, env.restarts).exists()
    assert trainer.checkpoints.steps() == [4]

    # the next start (a new assignment of round 2 with another batch) resumes exactly
    resumed_env = make_env(launch_round=2, local_bsz=2, accum_steps=2, batch_size=6)
    resumed = make_trainer(resumed_env)
    train(resumed, 5, seen)  # the old stop.json (round 2) does not apply to this start
    assert resumed.restored_step == 4
    assert exactly_once(seen, 5)


def test_sigterm_checkpoints_at_the_next_step_without_an_ack(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env()
    trainer = make_trainer(env, install_signal_handlers=True)
    seen: Counter[tuple[int, int]] = Counter()

    def terminate(step) -> None:  # type: ignore[no-untyped-def]
        if trainer.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        with pytest.raises(SystemExit):
            train(trainer, 3, seen, after=terminate)
    finally:
        trainer.signals.uninstall()
    assert trainer.step == 3  # the step in flight when the flag was agreed completed
    assert trainer.checkpoints.steps() == [3]
    assert not list(StatePaths(env.state_dir).job_dir(env.sia_id).glob("ack-*"))


def test_rebatch_is_adopted_after_the_same_step_without_restart(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env(launch_round=1)
    paths = StatePaths(env.state_dir)
    trainer = make_trainer(env)
    batches: list[tuple[int, int, int, int]] = []
    seen: Counter[tuple[int, int]] = Counter()

    def rebatch(step) -> None:  # type: ignore[no-untyped-def]
        b = trainer.batch
        batches.append((trainer.round, b.batch_size, b.local_bsz, b.accum_steps))
        if trainer.step == 2:
            new = Assignment(env.sia_id, 3, "a100", "a100", 1, 1, (), 12, 12, 0)
            write(paths.assignment(env.sia_id), new)
        if trainer.step == 6:  # another configuration: not a rebatch, ignored
            other = Assignment(env.sia_id, 4, "t4", "t4", 1, 2, (), 8, 4, 0)
            write(paths.assignment(env.sia_id), other)

    train(trainer, 2, seen, after=rebatch)
    assert exactly_once(seen, 2)
    assert batches[:2] == [(1, 8, 4, 1)] * 2
    assert batches[2] == (3, 12, 12, 0)  # adopted in the agreement of step 3
    assert set(batches[2:]) == {(3, 12, 12, 0)}


def test_a_run_left_behind_exits_without_a_checkpoint(make_env) -> None:  # type: ignore[no-untyped-def]
    """The assignment names another Slurm run (this run's slurmd died and the controller
    started the job elsewhere): the run stops after the step that saw it, writes neither a
    checkpoint (periodic ones included) nor an ack, and a later assignment for this very run
    (a rebatch) would not have stopped it."""
    env = make_env(launch_round=1, slurm_job_id="7", restarts=1)
    paths = StatePaths(env.state_dir)
    trainer = make_trainer(env, checkpoint_interval_s=0.0)  # a checkpoint after every step
    seen: Counter[tuple[int, int]] = Counter()

    def hand_over(step) -> None:  # type: ignore[no-untyped-def]
        if trainer.step == 2:  # a rebatch for this run (7.1): adopted, training goes on
            same = Assignment(env.sia_id, 2, "a100", "a100", 1, 1, (), 8, 4, 1, 1, "7", 1)
            write(paths.assignment(env.sia_id), same)
        if trainer.step == 4:  # the job's next run (7.2) elsewhere
            other = Assignment(env.sia_id, 3, "a100", "a100", 1, 1, (), 8, 4, 1, 2, "7", 2)
            write(paths.assignment(env.sia_id), other)

    with pytest.raises(SystemExit) as left:
        train(trainer, 5, seen, after=hand_over)
    assert left.value.code == 0
    assert trainer.step == 5 and trainer.round == 2  # stopped after the step that saw it
    assert trainer.checkpoints.steps()[0] == 4  # the periodic one of step 5 was not written
    assert not list(paths.job_dir(env.sia_id).glob("ack-*"))


def test_every_step_must_be_finished(make_env) -> None:  # type: ignore[no-untyped-def]
    trainer = make_trainer(make_env())
    with pytest.raises(TrainerError, match=r"step\.finish\(\)"):
        for _ in trainer.epochs(1):
            for _step in trainer.steps():
                pass


def test_accumulated_micro_batches_give_the_direct_noise_estimate(make_env) -> None:  # type: ignore[no-untyped-def]
    """One replica, 4 micro-batches of 3: c = 4 gradient samples of b = 3 each."""
    env = make_env(batch_size=12, local_bsz=3, accum_steps=3, init_batch_size=6)
    trainer = make_trainer(env, noise_decay=0.0)
    model = trainer.model
    initial = {k: v.clone() for k, v in model.module.state_dict().items()}
    micro_batches = []
    for _ in trainer.epochs(1, max_steps=1):
        for step in trainer.steps():
            micro_batches = [list(m) for m in step.plan.micro_batches]
            for x, y in step.micro_batches():
                step.backward(F.mse_loss(model(x).squeeze(1), y))
            step.finish()
    reference = torch.nn.Linear(4, 1)
    reference.load_state_dict(initial)
    data = dataset()
    grads = []
    for indices in micro_batches:
        reference.zero_grad()
        x, y = data[indices]
        F.mse_loss(reference(x).squeeze(1), y).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in reference.parameters()]).double())
    c = len(grads)
    mean = torch.stack(grads).mean(0)
    a, b = float(mean.dot(mean)), sum(float(g.dot(g)) for g in grads) / c
    grad_sqr = (c * a - b) / (c - 1)
    grad_var = (b - a) * (12 / 6) / (c - 1)
    assert c == 4
    assert trainer.noise.grad_sqr == pytest.approx(grad_sqr, rel=1e-4)
    assert trainer.noise.grad_var == pytest.approx(grad_var, rel=1e-4)


def test_outside_sia_launch_the_missing_variable_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="SIA_SIA_ID: not set; run the training command under"):
        JobEnvironment.from_env({})


def test_a_forward_pass_around_the_wrapper_is_refused(make_env) -> None:  # type: ignore[no-untyped-def]
    """Calling the module given to the trainer instead of trainer.model skips DDP's gradient
    synchronisation: the step refuses to apply that gradient."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    trainer = ElasticTrainer(
        model, optimizer, dataset(), env=make_env(), install_signal_handlers=False
    )
    with pytest.raises(TrainerError, match=r"call trainer\.model"):
        for _ in trainer.epochs(1):
            for step in trainer.steps():
                for x, y in step.micro_batches():
                    step.backward(F.mse_loss(model(x).squeeze(1), y))
                step.finish()
