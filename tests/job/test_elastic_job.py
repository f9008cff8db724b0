"""The DDP wrappers in one process (a one-process gloo group): a stop mid-epoch resumes on
another batch with every sample once, the GradScaler, scheduler and RNG states restored; a
rebatch with DataLoader workers prefetching; the uneven last step weighs its micro-batches
by size; one replica's noise estimate from two steps equals the direct one under loss
scaling; a state that a weights_only load would refuse fails at the first save."""

from __future__ import annotations

import gc
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from sia_slurm.job.elastic import (
    CheckpointError,
    ElasticDataLoader,
    ElasticDataParallel,
    ElasticJob,
)
from sia_slurm.job.elastic.distributed import DistributedError, choose_backend, collective_timeout
from sia_slurm.job.elastic.lr import LRScaling, default_rule
from sia_slurm.job.elastic.noise import GradientNoise
from sia_slurm.job.jobenv import JobEnvironment
from sia_slurm.job.runs import training_name
from sia_slurm.protocol import Assignment, StatePaths, StopRequest, write_document
from sia_slurm.safefiles import read_json

SIZE = 40


def dataset(size: int = SIZE) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(size, 4, generator=gen)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(size, generator=gen)
    return TensorDataset(x, y, torch.arange(size))


class Run:
    """One training process's objects, as a script makes them."""

    def __init__(self, env: JobEnvironment, *, lr=0.05, workers=0, size=SIZE, interval=1):  # type: ignore[no-untyped-def]
        self.job = ElasticJob(
            env, install_signal_handlers=False, noise_decay=0.0, control_interval=interval
        )
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.9)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=1)
        self.ddp = ElasticDataParallel(
            self.model,
            self.optimizer,
            scheduler=self.scheduler,
            scaler=self.scaler,
            lr_scaling="none",
            job=self.job,
        )
        self.loader = ElasticDataLoader(dataset(size), num_workers=workers, job=self.job)
        self.seen: Counter[tuple[int, int]] = Counter()
        self.scales: list[tuple[int, float]] = []

    def train(self, epochs: int, after: Callable[[Run], Any] | None = None) -> None:
        for epoch in self.job.remaining_epochs(epochs):
            for x, y, indices in self.loader:
                loss = F.mse_loss(self.ddp(x).squeeze(1), y)
                self.scaler.scale(loss).backward()
                self.scaler.unscale_(self.optimizer)
                self.ddp.clip_grad_norm_(100.0)
                if self.ddp.syncing:
                    self.scales.append((self.job.step, self.scaler.get_scale()))
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.optimizer.zero_grad()
                self.seen.update((epoch, int(i)) for i in indices)
                if after is not None and self.ddp.syncing:
                    after(self)
            self.scheduler.step()


def test_stop_mid_epoch_resumes_on_another_batch_with_state_and_rng(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env(batch_size=8, local_bsz=8, accum_steps=0, init_batch_size=8, linger_s=0.1)
    paths = StatePaths(env.state_dir)

    def request_stop(run: Run) -> None:
        if run.job.step == 2:  # during step 3 (index 2): obeyed after it
            write_document(paths.stop_request(env.sia_id), StopRequest(env.sia_id, 2))

    first = Run(env)
    with pytest.raises(SystemExit) as stopped:
        first.train(3, after=request_stop)
    assert stopped.value.code == 0
    after_stop = torch.rand(3)  # the RNG state the checkpoint holds draws this next
    assert paths.ack(env.sia_id, 2, "7", 0).exists()
    assert first.job.checkpoints.steps() == [3]
    assert [s for _, s in first.scales] == [256.0, 512.0, 1024.0]  # growth_interval=1

    second_env = make_env(
        batch_size=8, local_bsz=4, accum_steps=1, init_batch_size=8, launch_round=2, restarts=1
    )
    second = Run(second_env)
    assert torch.equal(torch.rand(3), after_stop)  # the rank's RNG state came back
    assert second.job.step == 3 and second.loader.sampler.position == 24
    assert second.scaler.get_scale() == 2048.0  # the scaler's state, updated after step 3
    state = first.optimizer.state_dict()["state"]
    restored = second.optimizer.state_dict()["state"]
    assert torch.equal(state[0]["momentum_buffer"], restored[0]["momentum_buffer"])
    second.train(3)
    assert second.scales[0] == (3, 2048.0)
    seen = first.seen + second.seen
    assert seen == Counter((e, i) for e in range(3) for i in range(SIZE))  # each sample once
    assert second.job.step == 15 and second.job.checkpoints.steps() == [15, 3]
    assert second.scheduler.last_epoch == 3


def test_the_time_ddp_spends_before_the_models_forward_is_kept_apart(make_env) -> None:  # type: ignore[no-untyped-def]
    """DDP's forward does work of its own before the model's (its buffer broadcast, a
    collective that waits on the peers): the wrapper keeps that time apart in the step's
    stats, and a dev cluster's slower type does not stretch it (devspeed.pace_step). Made
    measurable here: 20 ms of it before DDP's forward, 100 ms inside the model's: a share of
    the model's time counted in would show as more than 100 ms, while a 20 ms sleep stretched
    by the load beside a CI run stays far below it (a bound of 40 ms failed at load 16)."""
    env = make_env(batch_size=8, local_bsz=8, accum_steps=0, init_batch_size=8)
    run = Run(env)
    run.ddp.ddp.register_forward_pre_hook(lambda _m, _a: time.sleep(0.02))
    run.model.register_forward_pre_hook(lambda _m, _a: time.sleep(0.1))  # after the wrapper's
    spent: list[float] = []
    run.train(1, after=lambda r: spent.append(r.job.stats.ddp_forward_s))
    assert len(spent) == SIZE // 8
    assert all(0.02 <= s < 0.1 for s in spent), spent


def test_rebatch_with_prefetching_workers_keeps_every_sample_once(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env(batch_size=8, local_bsz=8, accum_steps=0, init_batch_size=8)
    paths = StatePaths(env.state_dir)
    batches: list[tuple[int, int]] = []

    def rebatch(run: Run) -> None:
        batches.append((run.job.batch.local_bsz, run.job.batch.accum_steps))
        if run.job.step == 1:
            write_document(
                paths.assignment(env.sia_id),
                Assignment(env.sia_id, 2, "a100", "dgx", 1, 1, (), 16, 4, 3),
            )

    run = Run(env, workers=2)
    run.train(2, after=rebatch)
    assert run.seen == Counter((e, i) for e in range(2) for i in range(SIZE))
    assert batches[:2] == [(8, 0), (8, 0)] and set(batches[2:]) == {(4, 3)}
    assert run.job.round == 2 and run.job.batch.batch_size == 16


def test_the_uneven_last_step_weighs_each_micro_batch_by_its_size(make_env) -> None:  # type: ignore[no-untyped-def]
    # 15 samples at 8 = 4 x 2: the second step has 7 samples, in micro-batches of 4 and 3
    env = make_env(batch_size=8, local_bsz=4, accum_steps=1, init_batch_size=8)
    run = Run(env, lr=0.1, size=15)
    params: list[torch.Tensor] = []

    def keep(run: Run) -> None:
        params.append(torch.cat([p.detach().reshape(-1) for p in run.model.parameters()]))

    run.train(1, after=keep)
    order = run.loader.sampler.order(0)
    tail = [int(i) for i in order[8:15]]
    before = params[0]
    model = torch.nn.Linear(4, 1)
    model.weight.data, model.bias.data = before[:4].view(1, 4).clone(), before[4:].clone()
    x, y, _ = dataset(15)[tail]
    F.mse_loss(model(x).squeeze(1), y).backward()
    mean = torch.cat([model.weight.grad.reshape(-1), model.bias.grad])  # the 7-sample mean
    state = run.optimizer.state_dict()["state"]
    first_momentum = torch.cat(
        [state[0]["momentum_buffer"].reshape(-1), state[1]["momentum_buffer"]]
    )
    # momentum after two steps: 0.9 * g0 + g1, with g0 = the first buffer's value at step 1
    g0 = (params[0] - torch.cat([p.reshape(-1) for p in initial_parameters()])) / -0.1
    assert first_momentum.tolist() == pytest.approx((0.9 * g0 + mean).tolist(), rel=1e-4, abs=1e-6)


def initial_parameters() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [p.detach() for p in torch.nn.Linear(4, 1).parameters()]


def test_one_replica_estimates_noise_from_two_steps_under_loss_scaling(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env(batch_size=8, local_bsz=8, accum_steps=0, init_batch_size=8)
    run = Run(env, lr=0.0)  # the model stays put, so both steps' gradients are at one point
    samples = []
    run.train(1, after=lambda r: samples.append(r.job.last_noise_sample))
    # ``after`` runs in the loop body, before the loader ends the step: it sees the sample of
    # the step before; the first step has no previous gradient
    assert samples[:2] == [None, None] and all(s is not None for s in samples[2:])
    order = run.loader.sampler.order(0)
    grads = []
    for step in range(2):
        model = torch.nn.Linear(4, 1)
        model.load_state_dict(run.model.state_dict())
        x, y, _ = dataset()[[int(i) for i in order[8 * step : 8 * step + 8]]]
        F.mse_loss(model(x).squeeze(1), y).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double())
    mean = (grads[0] + grads[1]) / 2
    expected = [
        float(mean.dot(mean)),
        (float(grads[0].dot(grads[0])) + float(grads[1].dot(grads[1]))) / 2,
    ]
    assert samples[2][:2] == pytest.approx(expected, rel=1e-5)  # the loss scale divided out
    assert samples[2][2:] == (2, 8.0)


def test_a_state_that_weights_only_would_refuse_fails_at_the_first_save(make_env) -> None:  # type: ignore[no-untyped-def]
    run = Run(make_env())
    run.job.user_state["table"] = np.zeros(3)
    with pytest.raises(CheckpointError, match=r"state\['user'\]\['table'\]: a numpy.ndarray"):
        run.job.save_checkpoint()
    assert run.job.checkpoints.steps() == []
    run.job.user_state["table"] = torch.zeros(3)
    assert run.job.save_checkpoint().endswith("ckpt-0000000000.pt")


def test_keep_n_checkpoints_is_configurable(make_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    job = ElasticJob(make_env(), install_signal_handlers=False, checkpoint_keep=3)
    run_sampler = ElasticDataLoader(dataset(), job=job)
    assert run_sampler.sampler is job.sampler
    for step in range(5):
        job.step = step
        job.save_checkpoint()
    assert job.checkpoints.steps() == [4, 3, 2]
    assert sorted(p.name for p in job.checkpoints.directory.iterdir()) == sorted(
        f"ckpt-{s:010d}.pt{suffix}" for s in (2, 3, 4) for suffix in ("", ".rng", ".sha256")
    )


def test_noise_is_measured_on_pairs_of_steps_every_control_interval(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env(batch_size=4, local_bsz=4, accum_steps=0, init_batch_size=4)
    run = Run(env, lr=0.0, interval=4)  # 10 steps: pairs (2, 3) and (6, 7) are measured
    measured: list[int] = []
    run.train(1, after=lambda r: measured.append(r.job.step) if r.job.measuring else None)
    assert measured == [2, 3, 6, 7]
    assert run.job.noise.samples == 2


def test_sigterm_checkpoints_the_agreed_step_and_records_terminated(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env(batch_size=8, local_bsz=8, accum_steps=0, init_batch_size=8)
    run = Run(env)
    training = StatePaths(env.state_dir).job_dir(env.sia_id) / training_name("7", 0)
    assert read_json(training)["end"] is None  # rank 0 said that the run began

    def terminate(run: Run) -> None:
        if run.job.step == 1:
            run.job.signals.terminate = signal.SIGTERM  # as the handler does

    with pytest.raises(SystemExit) as ended:
        run.train(3, after=terminate)
    assert ended.value.code == 0
    assert run.job.checkpoints.steps() == [2]  # the step in flight completed, then saved
    assert read_json(training) | {"time": 0} == {"steps": 2, "end": "terminated", "time": 0}


def test_completion_is_recorded_only_when_the_epochs_run_out(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env(batch_size=8, local_bsz=8, accum_steps=0, init_batch_size=8)
    run = Run(env)
    run.train(1)
    training = StatePaths(env.state_dir).job_dir(env.sia_id) / training_name("7", 0)
    assert read_json(training)["end"] == "completed" and read_json(training)["steps"] == 5


def test_backend_follows_the_device_and_the_timeout_is_checked() -> None:
    assert choose_backend(cuda_available=True, nccl_available=True) == "nccl"
    assert choose_backend(cuda_available=True, nccl_available=False) == "gloo"
    assert choose_backend(cuda_available=False, nccl_available=True) == "gloo"
    assert collective_timeout({}) == 300.0
    assert collective_timeout({"SIA_COLLECTIVE_TIMEOUT_S": "42.5"}) == 42.5
    for bad in ("0", "-3", "soon"):
        with pytest.raises(DistributedError, match=f"SIA_COLLECTIVE_TIMEOUT_S: .*'{bad}'"):
            collective_timeout({"SIA_COLLECTIVE_TIMEOUT_S": bad})


def test_the_lr_rule_follows_the_optimizer_unless_given() -> None:
    params = [torch.nn.Parameter(torch.zeros(1))]
    assert default_rule(torch.optim.SGD(params, lr=0.1)) == "adascale"
    assert default_rule(torch.optim.AdamW(params)) == "sqrt"
    assert LRScaling(lambda scale: scale**0.25, 8).factor(128, GradientNoise(8)) == 2.0


def test_a_dropped_loader_stops_its_workers_at_once(make_env) -> None:  # type: ignore[no-untyped-def]
    """Mid-epoch, its two workers prefetching: a loader freed by its last reference (the
    collector off) stops them then. A reference cycle through the DataLoader's batch sampler
    left it to the collector, whose teardown took 10 s at whatever step it ran."""
    env = make_env(batch_size=8, local_bsz=8, accum_steps=0, init_batch_size=8)
    run = Run(env, workers=2)
    passing = iter(run.loader)
    next(passing)
    workers = list(run.loader._loader._iterator._workers)
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    gc.disable()
    try:
        started = time.monotonic()
        del passing
        run.loader = None  # type: ignore[assignment]
        stopped = time.monotonic() - started
    finally:
        gc.enable()
    assert not any(w.is_alive() for w in workers)
    assert stopped < 3.0, stopped  # each unfinished worker costs 5 s
