"""A DataLoader that follows the batch the scheduler assigns and resumes mid-epoch exactly.

``ElasticDataLoader(dataset, num_workers=4, pin_memory=True)`` replaces a ``DataLoader`` with
a ``DistributedSampler``. It is a ``torch.utils.data.DataLoader`` underneath (workers, pinned
memory, prefetch, ``collate_fn``, persistent workers), fed by a batch sampler that plans
optimizer steps with :class:`~sia_slurm.job.elastic.ElasticSampler`: the epoch's order is fixed by
``(seed, epoch)`` whatever the world size, and the job's checkpoint keeps the position, so a
job moved to another number of GPUs continues with the next sample, none skipped or repeated.

Iterating yields this rank's micro-batches of each remaining step of the epoch, the
``local_bsz x (accum_steps + 1)`` of the current assignment. The workers prefetch ahead; when
the ranks adopt a new batch (a rebatch, decided after a step), the loader drops what was
prefetched for the old batch and starts a new pass of its workers at the committed position.
On an epoch's uneven last step a rank whose share is empty gets one padding sample whose
gradient weighs 0, so every rank runs the same forward/backward count DDP requires.
Map-style datasets only (an iterable dataset has no position to resume from).
"""

from __future__ import annotations

import collections
import logging
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from sia_slurm.job.elastic.job import ElasticJob, ElasticJobError, current_job
from sia_slurm.job.elastic.sampler import ElasticSampler, StepPlan
from sia_slurm.job.elastic.steps import MicroBatch, plan_micro_batches

logger = logging.getLogger(__name__)


class ElasticDataLoader:
    """See the module docstring. ``DataLoader`` options pass through, except the batch
    size, sampler and shuffling, which the scheduler's assignment and ``seed`` decide."""

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        shuffle: bool = True,
        seed: int | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool | None = None,
        job: ElasticJob | None = None,
        **loader_options: Any,
    ):
        if isinstance(dataset, IterableDataset):
            raise ElasticJobError(
                "ElasticDataLoader: an IterableDataset has no position to resume from; "
                "use a map-style dataset (len and __getitem__)"
            )
        for name in ("batch_size", "sampler", "batch_sampler", "drop_last"):
            if name in loader_options:
                raise ElasticJobError(
                    f"ElasticDataLoader: {name} is decided by the scheduler's assignment; remove it"
                )
        self.job = job if job is not None else current_job()
        self.dataset = dataset
        size = len(dataset)  # type: ignore[arg-type]
        self.sampler = ElasticSampler(
            size, seed=self.job.seed if seed is None else seed, shuffle=shuffle
        )
        self.job.attach_sampler(self.sampler)
        self._pending: collections.deque[MicroBatch] = collections.deque()
        self._batch_sampler = _StepSampler(self)
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        self._loader = DataLoader(
            dataset,
            batch_sampler=self._batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            **loader_options,
        )

    def __iter__(self) -> Iterator[Any]:
        """This rank's micro-batches of the epoch's remaining steps."""
        job = self.job
        while not self.sampler.epoch_done and not job.steps_exhausted():
            job.obey_control()
            batch = job.batch
            self._pending.clear()
            for data in self._loader:
                micro = self._pending.popleft()
                job.begin_micro(micro)
                yield data
                if not micro.last:
                    continue
                job.finish_step()
                job.obey_control()
                if job.batch != batch or job.steps_exhausted():
                    break  # drop what the workers prefetched for the old batch
        job.obey_control()

    def __len__(self) -> int:
        """Micro-batches left in the epoch from the committed step on at the current batch (a
        whole epoch once this one is done); a rebatch changes it."""
        sampler, batch = self.sampler, self.job.batch
        left = (
            sampler.dataset_size if sampler.epoch_done else sampler.dataset_size - sampler.position
        )
        full, tail = divmod(left, batch.batch_size)  # the tail step: as few as fit (sampler.plan)
        return full * (batch.accum_steps + 1) + -(-tail // (self.job.replicas * batch.local_bsz))


def _plans(job: ElasticJob, committed: ElasticSampler) -> Iterator[StepPlan]:
    """The steps from the committed position on, planned ahead for the workers; given the job
    and the sampler, not the loader, so that a pass holds no reference to it (_StepSampler)."""
    cursor = ElasticSampler(committed.dataset_size, seed=committed.seed, shuffle=committed.shuffle)
    cursor.load_state_dict(committed.state_dict())
    batch, steps = job.batch, job.step
    while job.max_steps is None or steps < job.max_steps:
        plan = job.plan(cursor, batch)
        if plan is None:
            return
        yield plan
        cursor.advance(plan)
        steps += 1


class _StepSampler(Sampler[list[int]]):
    """The DataLoader's batch sampler: one list of indices per micro-batch, in step order,
    with the micro-batch's place recorded for the loader (the DataLoader keeps order).

    It holds its loader weakly: the loader holds the DataLoader, which holds its iterator
    (persistent workers) and this sampler. A strong reference back made a cycle, so a dropped
    loader (one made again each epoch, Lightning's reloading) was freed only by the garbage
    collector, whenever it next ran, mid-step: its iterator's finalizer then waited 5 s for
    each worker, whose queues the collector had torn down first (10 s with 2 workers). Freed
    by its last reference instead, the loader stops its workers at once."""

    def __init__(self, loader: ElasticDataLoader):
        self._loader_ref = weakref.ref(loader)

    @property
    def _loader(self) -> ElasticDataLoader:
        loader = self._loader_ref()
        if loader is None:
            raise ElasticJobError("ElasticDataLoader: iterated after the loader was dropped")
        return loader

    def __iter__(self) -> Iterator[list[int]]:
        # what the pass needs, and not the loader: the DataLoader's iterator keeps this generator
        loader = self._loader
        pending, job, committed = loader._pending, loader.job, loader.sampler
        replicas = job.replicas
        del loader
        for plan in _plans(job, committed):
            for micro in plan_micro_batches(plan, replicas):
                pending.append(micro)
                yield micro.indices

    def __len__(self) -> int:
        return len(self._loader)
