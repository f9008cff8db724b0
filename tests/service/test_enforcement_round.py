"""Every round that is not a dry run calls the backend's ``apply``, with no actions too: the
Slurm backend undoes what the controller did not grant there, and must not wait for a
decision to do so."""

from __future__ import annotations

from collections.abc import Sequence

from sia_slurm.cluster import Action, ActionResult, ClusterSnapshot
from sia_slurm.config import SiaConfig
from sia_slurm.protocol import JobSpec
from sia_slurm.service import open_controller, run_round
from sia_slurm.state import Journal, Store
from tests.service.fakes import FakeCluster


class Recording:
    """The fake cluster, recording each ``apply``'s actions; ``fail`` makes apply raise."""

    def __init__(self, inner: FakeCluster, fail: bool = False) -> None:
        self.inner, self.fail = inner, fail
        self.applied: list[list[Action]] = []

    def snapshot(self) -> ClusterSnapshot:
        return self.inner.snapshot()

    def apply(self, actions: Sequence[Action]) -> list[ActionResult]:
        self.applied.append(list(actions))
        if self.fail:
            raise RuntimeError("scontrol is gone")
        return self.inner.apply(actions)


def one_round(config: SiaConfig, backend: Recording, store: Store, dry_run: bool = False):  # type: ignore[no-untyped-def]
    controller, _ = open_controller(config, store)
    return run_round(config, backend, store, controller, dry_run)  # type: ignore[arg-type]


def test_a_round_without_actions_still_applies(
    config: SiaConfig, store: Store, cluster: FakeCluster
) -> None:
    backend = Recording(cluster)
    report = one_round(config, backend, store)
    assert report.actions == () and not report.error
    assert backend.applied == [[]]


def test_a_dry_run_applies_nothing_not_even_enforcement(
    config: SiaConfig, store: Store, cluster: FakeCluster
) -> None:
    cluster.submit(JobSpec("job0", "cifar10", submit_time=cluster.time))
    backend = Recording(cluster)
    for _ in range(2):
        one_round(config, backend, store, dry_run=True)
    assert backend.applied == []


def test_a_failed_enforcement_is_the_rounds_error_and_journals_nothing(
    config: SiaConfig, store: Store, cluster: FakeCluster
) -> None:
    backend = Recording(cluster, fail=True)
    report = one_round(config, backend, store)
    assert report.actions == () and backend.applied == [[]]
    assert report.error == "apply failed: RuntimeError: scontrol is gone"
    assert Journal(store).entries() == []
    assert store.last_round() is not None  # the round itself was recorded
