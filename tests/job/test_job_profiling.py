"""The job side of a profiling run (docs/profiling.md) in one process (a one-process gloo
group): the sweep trains real steps at each per-GPU batch, stops at the dev cluster's emulated
memory or at a (faked) CUDA out-of-memory error, writes a profile document the controller's
checks accept, and trains on at the assignment's batch; a restored run on another type adds
it, a measured type is not swept again, a run that died mid-sweep is remembered, and a stop
mid-sweep drops it. The same through the step loop, a plain DDP loop and Lightning."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from sia_slurm.job.elastic import ElasticDataLoader, ElasticDataParallel, ElasticJob, ElasticTrainer
from sia_slurm.job.elastic.job_profiling import TRYING_FILE, ProfileSweep, fit_batch, typical_timing
from sia_slurm.job.elastic.steps import Batch
from sia_slurm.job.jobenv import JobEnvironment, JobEnvironmentError
from sia_slurm.protocol import StatePaths, StopRequest, write_document
from sia_slurm.protocol.profile import AppProfile
from sia_slurm.protocol.profile_json import measured_problems, profile_from_json
from sia_slurm.safefiles import read_json

SIZE = 120
GPU_TYPES = {"dgx", "rtx", "t4"}  # the profile types the controller checks against
SWEEP = "2,4,8,16"
SECONDS_PER_SAMPLE = 0.002  # a step's compute grows with its batch, as a real model's does
MEMORY = "SIA_DEVCLUSTER_MEMORY"

Plan = tuple[int, int]  # (per-GPU batch, micro-batches) of one optimizer step


def dataset() -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(SIZE, 4, generator=gen)
    return TensorDataset(x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0]), torch.arange(SIZE))


class FakeOutOfMemory(torch.autograd.Function):
    """Passes its input through; its backward raises CUDA's out-of-memory error, after the
    layer above it has its gradient (DDP's reducer is then halfway through its buckets)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (faked by the test)")


class Model(torch.nn.Module):
    """Two linear layers; the forward sleeps per sample. From ``oom_from`` samples on, the
    backward (``where="backward"``) or the forward (``"forward"``) runs out of memory."""

    def __init__(self, oom_from: int | None = None, where: str = "backward"):
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(4, 8)
        self.second = torch.nn.Linear(8, 1)
        self.oom_from = oom_from
        self.where = where

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = self.oom_from is not None and len(x) >= self.oom_from
        if big and self.where == "forward":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (faked by the test)")
        time.sleep(SECONDS_PER_SAMPLE * len(x))
        hidden = self.first(x)
        if big:
            hidden = FakeOutOfMemory.apply(hidden)
        return self.second(hidden).squeeze(1)


def profiling_env(make_env: Callable[..., JobEnvironment], **overrides: object) -> JobEnvironment:
    """A profiling run of one GPU assigned a batch of 16 (more than fits after the sweep)."""
    values: dict[str, object] = {
        "batch_size": 16,
        "local_bsz": 16,
        "accum_steps": 0,
        "profile_sweep": SWEEP,
        "profile_min_s": 0.0,  # exactly SIA_PROFILE_STEPS timed steps per batch
    }
    values.update(overrides)
    return make_env(**values)


def profiled(env: JobEnvironment) -> tuple[dict[str, Any], AppProfile]:
    document = read_json(StatePaths(env.state_dir).profiled(env.sia_id))
    return document, profile_from_json(document, "profiled.json", GPU_TYPES)


def local_sizes(profile: AppProfile, gpu_type: str) -> list[int]:
    return [obs.local_bsz for obs in profile.seed[gpu_type]]


# ---- the step loop (ElasticTrainer) ----------------------------------------------------------


class TrainerRun:
    """An ElasticTrainer and what each of its steps was: plan, counted or dropped."""

    def __init__(self, env: JobEnvironment, model: Model | None = None):
        self.model = model or Model()
        optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.trainer = ElasticTrainer(
            self.model,
            optimizer,
            dataset(),
            env=env,
            install_signal_handlers=False,
            lr_scaling="none",
        )
        self.plans: list[Plan] = []
        self.dropped: list[tuple[Plan, int, int]] = []  # plan, step count, sampler position
        self.seen: Counter[tuple[int, int]] = Counter()

    def train(self, epochs: int, after: Callable[[TrainerRun], None] | None = None) -> None:
        trainer = self.trainer
        for _ in trainer.epochs(epochs):
            for step in trainer.steps():
                before = trainer.step
                for x, y, _ in step.micro_batches():
                    step.backward(F.mse_loss(trainer.model(x), y))
                step.finish()
                plan = (len(step.plan.micro_batches[0]), len(step.plan.micro_batches))
                if trainer.step == before:
                    self.dropped.append((plan, trainer.step, trainer.sampler.position))
                    continue
                self.plans.append(plan)
                self.seen.update((step.epoch, i) for m in step.plan.micro_batches for i in m)
                if after is not None:
                    after(self)


def each_once(seen: Counter[tuple[int, int]], epochs: range) -> bool:
    return seen == Counter((e, i) for e in epochs for i in range(SIZE))


SWEPT_TO_8 = [(2, 1)] * 4 + [(4, 1)] * 4 + [(8, 1)] * 4  # 1 warm-up + 3 measured steps each


def assert_timed(profile: AppProfile, gpu_types: set[str]) -> None:
    """Every type measured, each 1-GPU point a finite positive step time, and the whole
    document passes the controller's checks (measured_problems), its growth rule included:
    the sweep leaves out a batch that a busy moment made slower than a larger one."""
    assert measured_problems(profile, gpu_types) == []
    for gpu_type in gpu_types:
        times = [o.step_time for o in profile.seed[gpu_type] if o.gpus == 1]
        assert times and all(math.isfinite(t) and t > 0 for t in times), (gpu_type, times)


def assert_swept(profile: AppProfile, gpu_type: str, swept: list[int]) -> None:
    """The type's points are the swept batches, in order, the largest that fitted among them.
    A smaller one may be missing: on a loaded machine a whole batch's steps can wait for the
    CPU (66 ms at a batch of 2 against 12 ms at 4, once in CI at load 12), and the sweep then
    leaves it out (undercut_batches; exactly, on made-up timings, in
    test_a_sweep_leaves_out_a_batch_a_larger_one_undercuts)."""
    sizes = local_sizes(profile, gpu_type)
    assert sizes == sorted(sizes) and set(sizes) <= set(swept), (sizes, swept)
    assert sizes[-1] == swept[-1], (sizes, swept)


def test_a_sweep_capped_by_emulated_memory_writes_the_profile_and_trains_on(
    make_env, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(MEMORY, "a100=8,t4=4")
    env = profiling_env(make_env)
    run = TrainerRun(env)
    run.train(1)
    # 12 sweep steps (56 samples), then the assignment's 16 as 2 x 8 (8 fits, 16 not tried)
    assert run.plans == SWEPT_TO_8 + [(8, 2)] * 4
    assert run.trainer.step == 16 and each_once(run.seen, range(1))
    assert run.trainer.batch == Batch(16, 8, 1)
    document, profile = profiled(env)
    assert dict(profile.max_local_bsz) == {"dgx": 8}
    assert_swept(profile, "dgx", [2, 4, 8])
    assert_timed(profile, {"dgx"})
    assert (document["app"], document["min_local_bsz"]) == ("tiny", 2)
    assert (document["init_batch_size"], document["max_batch_size"]) == (8, 64)
    assert "dgx measured by job job-1 (Slurm job 7.0, on a100)" in document["description"]
    assert all(p["placement"] == "1" and p["sync_time"] < p["step_time"] for p in document["seed"])
    # the steps were timed as metrics are (warm-up included); a checkpoint keeps the sweep
    counts = {key[3:]: totals.count for key, totals in run.trainer.reporter.profile.items()}
    assert counts == {(2, 0): 4, (4, 0): 4, (8, 0): 4, (8, 1): 4}
    assert run.trainer.checkpoints.steps() == [16, 12]
    assert not (env.checkpoint_dir / TRYING_FILE).exists()

    # the next run, on another type, restores the first type's measurement and adds its own
    t4 = profiling_env(make_env, gpu_type="t4", profile_gpu_type="t4", launch_round=2, restarts=1)
    second = TrainerRun(t4)
    second.train(2)
    assert second.trainer.restored_step == 16
    assert second.plans == [(2, 1)] * 4 + [(4, 1)] * 4 + [(4, 4)] * 6  # epoch 1: 24 + 6 x 16
    assert each_once(second.seen, range(1, 2))
    _, both = profiled(t4)
    assert dict(both.max_local_bsz) == {"dgx": 8, "t4": 4}
    assert both.seed["dgx"] == profile.seed["dgx"]
    assert_timed(both, {"dgx", "t4"})

    # a run that does not profile, on a type measured already, trains at its assignment
    # fitted to the measured limit from the start
    before = read_json(StatePaths(env.state_dir).profiled(env.sia_id))
    third = TrainerRun(profiling_env(make_env, launch_round=3, restarts=2, profile_sweep=""))
    third.train(3)
    assert third.plans == [(8, 2)] * 7 + [(8, 1)]  # the measured limit; the epoch's tail
    assert third.trainer.job.profiling.sweep is None and not third.trainer.job.profiling.written
    assert read_json(StatePaths(env.state_dir).profiled(env.sia_id)) == before


def test_an_out_of_memory_error_in_the_backward_pass_ends_the_sweep_below_it(
    make_env, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    env = profiling_env(make_env)
    run = TrainerRun(env, Model(oom_from=8))
    run.train(1)
    # the step at 8 ran out of memory: neither counted nor advancing the sampler
    assert run.dropped == [((8, 1), 8, 24)]
    assert run.plans == [(2, 1)] * 4 + [(4, 1)] * 4 + [(4, 4)] * 6  # 24 + 6 x 16 samples
    assert run.trainer.step == 14 and each_once(run.seen, range(1))
    _, profile = profiled(env)
    assert dict(profile.max_local_bsz) == {"dgx": 4}
    assert_swept(profile, "dgx", [2, 4])
    assert_timed(profile, {"dgx"})
    # the dropped step's gradient was never applied: DDP's reducer and the model carry on
    assert all(torch.isfinite(p).all() for p in run.model.parameters())

    # outside a sweep the same error is the script's
    alone = make_env(batch_size=8, local_bsz=8, accum_steps=0, checkpoint_dir=tmp_path / "plain")
    plain = TrainerRun(alone, Model(oom_from=8))
    with pytest.raises(torch.cuda.OutOfMemoryError):
        plain.train(1)


def test_a_stop_mid_sweep_drops_it_and_the_next_run_measures_again(make_env) -> None:  # type: ignore[no-untyped-def]
    env = profiling_env(make_env, linger_s=0.05)
    paths = StatePaths(env.state_dir)

    def stop(run: TrainerRun) -> None:
        if run.trainer.step == 5:  # at 4, mid-sweep: obeyed after the next step
            write_document(paths.stop_request(env.sia_id), StopRequest(env.sia_id, 2))

    first = TrainerRun(env)
    with pytest.raises(SystemExit):
        first.train(1, after=stop)
    assert first.trainer.checkpoints.steps() == [6]
    assert not paths.profiled(env.sia_id).exists()
    assert not (env.checkpoint_dir / TRYING_FILE).exists()  # nothing failed

    second = TrainerRun(profiling_env(make_env, launch_round=2, restarts=1))
    second.train(2)  # the sweep at 16 runs over epoch 0's end
    assert second.plans[:12] == SWEPT_TO_8
    assert second.plans[12:] == [(16, 1)] * 10 + [(8, 1)]  # epoch 1 ends with 8 samples
    _, profile = profiled(env)
    assert dict(profile.max_local_bsz) == {"dgx": 16}


# ---- a plain DDP loop (ElasticDataParallel, ElasticDataLoader) -------------------------------


def ddp_train(env: JobEnvironment, model: Model, epochs: int) -> tuple[ElasticJob, list[Plan]]:
    job = ElasticJob(env, install_signal_handlers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ddp = ElasticDataParallel(model, optimizer, lr_scaling="none", job=job)
    loader = ElasticDataLoader(dataset(), job=job)
    plans: list[Plan] = []
    for _ in job.remaining_epochs(epochs):
        for x, y, _ in loader:
            F.mse_loss(ddp(x), y).backward()
            if ddp.syncing:
                plans.append((len(x), job.batch.accum_steps + 1))
            optimizer.step()
            optimizer.zero_grad()
    return job, plans


def test_a_ddp_loop_sweeps_and_a_run_that_died_mid_sweep_is_remembered(
    make_env, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(MEMORY, "a100=8")
    env = profiling_env(make_env)
    job, plans = ddp_train(env, Model(), 1)
    assert plans[:12] == SWEPT_TO_8 and plans[12:] == [(8, 2)] * 4
    assert job.step == 16 and job.completed
    _, profile = profiled(env)
    assert dict(profile.max_local_bsz) == {"dgx": 8}

    # on t4 the forward pass runs out of memory at 8 in the script's own code: the process
    # fails; the try file it left tells the next run that 8 does not fit there
    t4 = profiling_env(make_env, gpu_type="t4", profile_gpu_type="t4", launch_round=2, restarts=1)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        ddp_train(t4, Model(oom_from=8, where="forward"), 2)
    assert read_json(t4.checkpoint_dir / TRYING_FILE)["local_bsz"] == 8
    retry = profiling_env(
        make_env, gpu_type="t4", profile_gpu_type="t4", launch_round=3, restarts=2
    )
    job, plans = ddp_train(retry, Model(), 2)
    assert plans[:8] == [(2, 1)] * 4 + [(4, 1)] * 4 and set(plans[8:]) == {(4, 4)}
    _, both = profiled(env)
    assert dict(both.max_local_bsz) == {"dgx": 8, "t4": 4}
    assert not (env.checkpoint_dir / TRYING_FILE).exists()


# ---- Lightning -------------------------------------------------------------------------------


def lightning_regression() -> tuple[Any, Any]:
    """A Lightning module of :class:`Model` and tests/job/lightning_fit.py's trainer, imported
    when the test runs: Lightning's import (3.5 s of CPU) stays out of collection, which every
    xdist worker repeats."""
    import lightning.pytorch as L

    from tests.job.lightning_fit import trainer

    class Regression(L.LightningModule):
        def __init__(self, job: ElasticJob, oom_from: int | None = None):
            super().__init__()
            self.model = Model()
            self.job = job
            self.oom_from = oom_from
            self.seen: Counter[tuple[int, int]] = Counter()
            self.plans: list[Plan] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y, indices = batch
            if self.oom_from is not None and len(x) >= self.oom_from:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (faked by the test)")
            self.seen.update((self.current_epoch, int(i)) for i in indices)
            if self.job.current is not None and self.job.current.last:
                self.plans.append((len(x), self.job.batch.accum_steps + 1))
            return F.mse_loss(self.model(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> ElasticDataLoader:
            return ElasticDataLoader(dataset(), job=self.job)

    return trainer, Regression


@pytest.mark.xdist_group("lightning")  # one worker imports Lightning
# the step that ran out of memory returns None to Lightning, which skips it (and says so)
@pytest.mark.filterwarnings("ignore:`training_step` returned `None`")
@pytest.mark.parametrize(("memory", "oom_from"), [("a100=8", None), ("", 8)])
def test_lightning_sweeps_to_the_memory_limit_or_the_first_out_of_memory_error(
    make_env, monkeypatch: pytest.MonkeyPatch, memory: str, oom_from: int | None
) -> None:  # type: ignore[no-untyped-def]
    lightning_trainer, Regression = lightning_regression()
    monkeypatch.setenv(MEMORY, memory)
    env = profiling_env(make_env)
    job = ElasticJob(env, install_signal_handlers=False)
    module = Regression(job, oom_from)
    lightning_trainer(job, 1).fit(module)
    limit = 8 if oom_from is None else 4
    sweep = [(b, 1) for b in (2, 4, 8) if b <= limit for _ in range(4)]
    assert module.plans[: len(sweep)] == sweep
    assert set(module.plans[len(sweep) :]) == {(limit, 16 // limit)}
    assert job.completed and each_once(module.seen, range(1))  # Lightning's count followed
    _, profile = profiled(env)
    assert dict(profile.max_local_bsz) == {"dgx": limit}
    assert_timed(profile, {"dgx"})


# ---- the environment -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SIA_PROFILE_SWEEP", "4,2", "increasing"),
        ("SIA_PROFILE_SWEEP", "2,2", "increasing"),
        ("SIA_PROFILE_SWEEP", "0,2", "increasing per-GPU batches >= 1"),
        ("SIA_PROFILE_SWEEP", "2,,4", "comma-separated integers"),
        ("SIA_PROFILE_SWEEP", "2;4", "comma-separated integers"),
        ("SIA_PROFILE_STEPS", "0", "expected 1..100"),
        ("SIA_PROFILE_STEPS", "101", "expected 1..100"),
        ("SIA_PROFILE_STEPS", "three", "expected an integer"),
    ],
)
def test_bad_profiling_variables_are_named(make_env, name: str, value: str, message: str) -> None:  # type: ignore[no-untyped-def]
    environ = {**make_env().to_env(), name: value}
    with pytest.raises(JobEnvironmentError, match=f"{name}: .*{message}"):
        JobEnvironment.from_env(environ)


def test_the_sweep_reads_back_and_the_batch_after_it_is_split_evenly(make_env) -> None:  # type: ignore[no-untyped-def]
    env = JobEnvironment.from_env({**make_env().to_env(), "SIA_PROFILE_SWEEP": " 2, 4,8"})
    assert env.sweep == (2, 4, 8) and env.profile_steps == 3
    assert make_env().sweep == ()
    assert fit_batch(Batch(16, 16, 0), 8) == Batch(16, 8, 1)
    assert fit_batch(Batch(24, 24, 0), 5) == Batch(24, 4, 5)  # 24 = 6 x 4: 5 does not divide
    assert fit_batch(Batch(7, 7, 0), 3) == Batch(7, 1, 6)
    assert fit_batch(Batch(16, 4, 3), 8) == Batch(16, 4, 3)
    assert fit_batch(Batch(16, 16, 0), None) == Batch(16, 16, 0)


def test_a_batch_is_timed_by_its_mean_step_less_the_outliers() -> None:
    """Steps of 10 ms, a third slowed to 16 ms by a neighbour, one of 200 ms (a checkpoint):
    the batch's time is the mean of the others (12 ms, what the job's reports would carry),
    not their median (10 ms), and the checkpoint does not count."""
    times = [(0.010, 0.001), (0.010, 0.001), (0.016, 0.002)] * 4 + [(0.200, 0.001)]
    step, sync = typical_timing(times)
    assert step == pytest.approx(0.012)
    assert sync == pytest.approx(4 / 3 * 0.001)
    sweep = ProfileSweep("t4", (8, 16), steps=len(times))
    for timing in [None, *times]:  # the first step at a batch warms up
        sweep.record(timing)
    assert sweep.batch.local_bsz == 16
    result = sweep.result("me")
    assert result is not None and result.points[0][:2] == (8, pytest.approx(0.012))


def test_a_sweep_leaves_out_a_batch_a_larger_one_undercuts() -> None:
    """A busy moment at the first batch (35 ms, then 17 ms at twice the batch): the report
    would be refused and the type measured again in another run. The sweep leaves that point
    out; the largest batch that fitted stays what it was, and what is left passes the
    controller's growth rule."""
    from sia_slurm.protocol.profile_json import _shrinking

    sweep = ProfileSweep("t4", (2, 4, 8), steps=3)
    for step_time in (0.035, 0.017, 0.019):
        for timing in [None, *[(step_time, 0.0)] * 3]:  # a warm-up, then 3 timed steps
            sweep.record(timing)
    assert not sweep.running
    result = sweep.result("me")
    assert result is not None and result.max_local_bsz == 8
    assert [(b, t) for b, t, _ in result.points] == [
        (4, pytest.approx(0.017)),
        (8, pytest.approx(0.019)),
    ]
    assert _shrinking([(b, t) for b, t, _ in result.points]) == ""
