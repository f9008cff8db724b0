"""Checkpoints: atomic, two kept, and a damaged newest one falls back to the previous one —
including a writer SIGKILLed in the middle of the write (a real process, a real kill)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sia_slurm.job.elastic.checkpoint import CheckpointError, CheckpointManager

REPO = Path(__file__).resolve().parents[2]


def state(value: float) -> dict[str, object]:
    return {"weights": torch.full((64,), value), "step": int(value), "note": "x"}


def test_save_and_load_round_trip_and_keep_the_last_two(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "ckpt")
    assert manager.load() is None
    for step in (1, 2, 3):
        path = manager.save(step, state(step))
        assert path.name == f"ckpt-{step:010d}.pt"
    assert manager.steps() == [3, 2]
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names == [
        "ckpt-0000000002.pt",
        "ckpt-0000000002.pt.sha256",
        "ckpt-0000000003.pt",
        "ckpt-0000000003.pt.sha256",
    ]
    step, loaded = manager.load()  # type: ignore[misc]
    assert step == 3 and torch.equal(loaded["weights"], torch.full((64,), 3.0))
    assert manager.load(2)[1]["step"] == 2  # type: ignore[index]


@pytest.mark.parametrize("damage", ["truncate", "flip", "no-digest", "bad-digest"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(10, state(10))
    newest = manager.save(20, state(20))
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        newest.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif damage == "no-digest":
        manager.digest_path(newest).unlink()
    else:
        manager.digest_path(newest).write_text("not a digest\n")
    step, loaded = manager.load()  # type: ignore[misc]
    assert step == 10 and loaded["step"] == 10
    assert "ckpt-0000000020.pt" in caplog.text
    with pytest.raises(CheckpointError, match="incomplete or corrupt"):
        manager.load(20)


def test_a_complete_checkpoint_that_cannot_be_loaded_is_an_error(tmp_path: Path) -> None:
    """Garbage with a matching digest is not a torn write: falling back would hide a bug."""
    manager = CheckpointManager(tmp_path)
    manager.save(1, state(1))
    path = manager.path(2)
    payload = b"PK\x03\x04 definitely not a torch file"
    path.write_bytes(payload)
    digest = hashlib.sha256(payload).hexdigest()
    manager.digest_path(path).write_text(f"{digest} {len(payload)}\n")
    with pytest.raises(CheckpointError, match=r"ckpt-0000000002\.pt: complete checkpoint cannot"):
        manager.load()


def test_unwritable_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CheckpointError, match="cannot create"):
        CheckpointManager(blocker / "ckpt").save(1, state(1))


CRASH_WRITER = """
import os, sys, time
sys.path.insert(0, {repo!r})
import torch
from sia_slurm.job.elastic.checkpoint import CheckpointManager

class HalfThenHang(CheckpointManager):
    def _write_bytes(self, handle, data):
        handle.write(data[: len(data) // 2])
        handle.flush()
        os.fsync(handle.fileno())
        print("HALF", flush=True)
        time.sleep(60)

big = {{"weights": torch.arange(500_000, dtype=torch.float32), "step": 1}}
CheckpointManager({directory!r}).save(1, big)
print("SAVED", flush=True)
big["weights"] = big["weights"] * 2
big["step"] = 2
HalfThenHang({directory!r}).save(2, big)
"""


@pytest.mark.heavy
def test_sigkill_while_writing_restores_the_previous_complete_checkpoint(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    script = CRASH_WRITER.format(repo=str(REPO), directory=str(directory))
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "SAVED"
    assert proc.stdout.readline().strip() == "HALF"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    leftovers = list(directory.glob(".ckpt-0000000002.pt.*.tmp"))
    assert len(leftovers) == 1 and leftovers[0].stat().st_size > 0  # the torn write is there
    manager = CheckpointManager(directory)
    step, loaded = manager.load()  # type: ignore[misc]
    assert step == 1 and loaded["step"] == 1
    assert torch.equal(loaded["weights"], torch.arange(500_000, dtype=torch.float32))
    manager.save(3, state(3))  # the next save clears what the dead writer left
    assert not list(directory.glob(".*.tmp"))
    assert manager.steps() == [3, 1]
