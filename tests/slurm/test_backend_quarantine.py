"""The read stage of a quarantine, on the fake Slurm: a job whose files hold a hostile value,
or whose reading raises anything at all, sits the round out (``ClusterSnapshot.quarantined``)
while the others are observed as before; a started one keeps its GPUs counted as taken."""

from __future__ import annotations

from typing import Any

import pytest

from sia_slurm.slurm.observe.jobfiles import DocumentCache
from tests.slurm.test_backend import backend_for
from tests.slurm.test_backend_enforcement import started, usable


def test_a_spec_with_a_5000_digit_integer_quarantines_its_job_only(fake_slurm: Any) -> None:
    """The attack that once failed every round for ten minutes (issue 35)."""
    fake_slurm.submit("good")
    fake_slurm.submit("evil")
    spec = fake_slurm.paths.spec("evil")
    spec.write_text(spec.read_text().replace('"max_failures": 0', '"max_failures": ' + "9" * 5000))
    snapshot = backend_for(fake_slurm).snapshot()
    assert [job.sia_id for job in snapshot.jobs] == ["good"]
    assert set(snapshot.quarantined) == {"evil"}
    assert "max_failures: an integer of 5000 digits" in snapshot.quarantined["evil"]


def test_anything_raised_while_reading_a_job_is_that_jobs_alone(
    fake_slurm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, backend = started(fake_slurm, "evil", ["rtx-1"], per_node=2)
    fake_slurm.submit("good")
    real = DocumentCache.read_spec

    def read_spec(self: DocumentCache, directory: Any) -> Any:
        if directory.path.name == "evil":
            raise MemoryError("the spec's reader ran out")
        return real(self, directory)

    monkeypatch.setattr(DocumentCache, "read_spec", read_spec)
    snapshot = backend.snapshot()
    assert [job.sia_id for job in snapshot.jobs] == ["good"]
    assert snapshot.quarantined == {"evil": "MemoryError: the spec's reader ran out"}
    assert usable(snapshot)["rtx-1"] == 2  # its two GPUs count as taken, as an unmanaged job's
    assert any("job evil: not scheduled: MemoryError" in m for m in snapshot.rejected)


def test_a_profile_document_that_is_a_fifo_quarantines_its_job_without_blocking(
    fake_slurm: Any,
) -> None:
    import os

    fake_slurm.submit("good")
    fake_slurm.submit("evil")
    os.mkfifo(fake_slurm.paths.profile("evil"))
    snapshot = backend_for(fake_slurm).snapshot()  # a FIFO opened without blocking, refused
    assert [job.sia_id for job in snapshot.jobs] == ["good"]
    assert snapshot.quarantined["evil"].endswith("profile.json: not a regular file")


def test_a_profile_document_reaches_the_snapshot_as_read(fake_slurm: Any) -> None:
    from sia_slurm.protocol.profile import load_profiles
    from sia_slurm.protocol.profile_json import profile_to_json
    from sia_slurm.safefiles import write_json_atomic

    fake_slurm.submit("mine")
    document = profile_to_json(load_profiles().app("ncf"))
    write_json_atomic(fake_slurm.paths.profile("mine"), document)
    backend = backend_for(fake_slurm)
    (job,) = backend.snapshot().jobs
    assert job.profile_document == document
    (again,) = backend.snapshot().jobs  # unchanged: served from the cache, the same object
    assert again.profile_document is job.profile_document
