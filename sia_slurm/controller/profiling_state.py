"""One key's profiling, as the controller keeps it between rounds and across restarts.

The state of Sia's profiling of a new model (docs/profiling.md) for one *key* (an app and an
account, or a job alone): the GPU types measured so far, what each job was given, the
documents refused and why. :class:`Profiling` takes in what a job measured (its
``profiled.json``, checked type by type), says when the profiling is held, and turns the
measured types into a profile document; :meth:`Profiling.to_json` and
:meth:`Profiling.from_json` are its form in the controller's memory
(``sia_slurm/service/controller_memory.py``). The round stage that drives it, job by job, is
:class:`sia_slurm.controller.profiling.Profiler`.

Nothing here reads a file, nor knows the cluster: documents are handed in, already read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sia_slurm.model.batch import BatchLimits
from sia_slurm.protocol import PROFILED_FILE, ProtocolError
from sia_slurm.protocol.profile_json import (
    PROFILE_FORMAT,
    measured_problems,
    measured_seed,
    profile_from_json,
)

# A type whose measured document was refused this many times holds the job (it is quarantined
# with the reason) instead of being measured again.
MAX_REFUSALS = 2
# The account part of the key of a job that profiles for itself alone (no app): no account
# has a '/' in its name (a job without an account, no Slurm accounting, has "")
OWN = "/"
ProfileKey = tuple[str, str]  # (account, app), or (OWN, sia id)

__all__ = ["MAX_REFUSALS", "OWN", "ProfileKey", "Profiling"]


@dataclass
class Profiling:
    """One key's profiling: the types measured so far and what each job was given."""

    key: ProfileKey
    limits: BatchLimits
    started: float
    # profile type -> (largest per-GPU batch that fits, measured 1-GPU points as
    # (local batch, step time, sync time)), every one checked
    measured: dict[str, tuple[int, tuple[tuple[int, float, float], ...]]] = field(
        default_factory=dict
    )
    given: dict[str, set[str]] = field(default_factory=dict)  # sia id -> profile types run on
    refusals: dict[str, int] = field(default_factory=dict)  # profile type -> documents refused
    said: str = ""  # the last refusal, for explain
    seen: dict[str, str] = field(default_factory=dict)  # sia id -> its last document's digest
    # sia id -> the run (restarts, profile type) whose measurement was last refused: it is
    # measured again in another run
    refused_run: dict[str, tuple[int, str]] = field(default_factory=dict)
    # profile type -> the digest of its last refused points (not counted twice)
    judged: dict[str, str] = field(default_factory=dict)
    # sia id -> (restarts, profile type, since when) of the run it is on
    on_since: dict[str, tuple[int, str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """This profiling as JSON (the controller's memory keeps it across restarts)."""
        return {
            "key": list(self.key),
            "limits": [
                self.limits.init_batch_size,
                self.limits.max_batch_size,
                self.limits.min_local_bsz,
            ],
            "started": self.started,
            "measured": {
                t: [limit, [list(p) for p in points]]
                for t, (limit, points) in self.measured.items()
            },
            "given": {j: sorted(types) for j, types in self.given.items()},
            "refusals": dict(self.refusals),
            "said": self.said,
            "seen": dict(self.seen),
            "refused_run": {j: list(run) for j, run in self.refused_run.items()},
            "on_since": {j: list(run) for j, run in self.on_since.items()},
            "judged": dict(self.judged),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Profiling:
        """The profiling :meth:`to_json` wrote (the controller's own database: a malformed
        one raises and is left out by the loader)."""
        account, app = data["key"]
        m0, largest, smallest = (int(v) for v in data["limits"])
        return cls(
            key=(str(account), str(app)),
            limits=BatchLimits(m0, largest, smallest),
            started=float(data["started"]),
            measured={
                str(t): (int(limit), tuple((int(m), float(s), float(y)) for m, s, y in points))
                for t, (limit, points) in data["measured"].items()
            },
            given={str(j): {str(t) for t in types} for j, types in data["given"].items()},
            refusals={str(t): int(n) for t, n in data["refusals"].items()},
            said=str(data.get("said", "")),
            seen={str(j): str(f) for j, f in data.get("seen", {}).items()},
            refused_run={
                str(j): (int(r), str(t)) for j, (r, t) in data.get("refused_run", {}).items()
            },
            on_since={
                str(j): (int(r), str(t), float(since))
                for j, (r, t, since) in data.get("on_since", {}).items()
            },
            judged={str(t): str(f) for t, f in data.get("judged", {}).items()},
        )

    # ---- what the job measured ---------------------------------------------------------------

    def take(
        self,
        sia_id: str,
        document: Mapping[str, Any],
        gpu_types: Collection[str],
        run: tuple[int, str] | None,
        version: str = "",
    ) -> str:
        """Take the types of ``document`` (job ``sia_id``'s ``profiled.json``) that the job
        was given and that are not measured yet, each checked on its own; why something was
        refused (``""`` when all was taken, or nothing was new). ``run`` is the job's run
        (restarts, profile type). A document that is not a profile, or names a type the job
        was never given, is refused as a whole against the run's type; a type whose points
        are not sound is refused alone, once per set of points (the job keeps a refused type
        in its document until it measures it again). ``version`` tells writes of the file
        apart (the same content written again is read again); without it, the content does."""
        text = _fingerprint({"document": document, "version": version})
        if self.seen.get(sia_id) == text:
            return ""
        self.seen[sia_id] = text
        where = f"job {sia_id}: {PROFILED_FILE}"
        given = self.given.get(sia_id, set())
        try:
            profile = profile_from_json(document, where, gpu_types)
            lied = sorted(set(profile.seed) - given)
            if lied:
                raise ProtocolError(
                    f"{where}: seed: type(s) {', '.join(lied)} measured, but the job was "
                    f"given only {', '.join(sorted(given)) or 'none'}"
                )
        except (ProtocolError, ValueError) as exc:
            self.refuse(sia_id, run, str(exc))
            return self.said
        said = []
        for gpu_type in sorted(set(profile.seed) - set(self.measured)):
            points = tuple(
                (o.local_bsz, o.step_time, o.sync_time)
                for o in sorted(profile.seed[gpu_type], key=lambda o: o.local_bsz)
                if o.gpus == 1
            )
            entry = (profile.max_local_bsz[gpu_type], points)
            judged = _fingerprint({"entry": repr(entry)})
            if self.judged.get(gpu_type) == judged:
                continue  # refused before, not measured again since
            problems = measured_problems(profile, [gpu_type])
            if problems:
                self.judged[gpu_type] = judged
                self.refuse(sia_id, (run[0], gpu_type) if run else None, f"{where}: {problems[0]}")
                said.append(self.said)
                continue
            self.measured[gpu_type] = entry
        return "; ".join(said)

    def take_unreadable(
        self, sia_id: str, problem: str, run: tuple[int, str] | None, version: str = ""
    ) -> None:
        """Refuse job ``sia_id``'s ``profiled.json`` that could not be read (``problem`` says
        why), against the run's type, once per write of the file (``version``)."""
        written = _fingerprint({"unreadable": problem, "version": version})
        if self.seen.get(sia_id) != written:
            self.seen[sia_id] = written
            self.refuse(sia_id, run, problem)

    def refuse(self, sia_id: str, run: tuple[int, str] | None, why: str) -> None:
        """Count a refused measurement against the run's type, and say why; that run is not
        offered the type again."""
        self.said = why
        if run is not None:
            self.refusals[run[1]] = self.refusals.get(run[1], 0) + 1
            self.refused_run[sia_id] = run

    def held_types(self) -> list[str]:
        """The types refused too often to measure them again: the profiling is held."""
        return sorted(t for t, n in self.refusals.items() if n >= MAX_REFUSALS)

    # ---- the profile -------------------------------------------------------------------------

    def missing(self, required: Iterable[str]) -> list[str]:
        """The profile types of ``required`` not measured yet."""
        return sorted(set(required) - set(self.measured))

    def document(self, now: float, who: str) -> dict[str, Any]:
        """The measured profile as a profile document (``profile.json``'s format)."""
        seed = measured_seed(self.measured)
        smallest = min(m for _, points in self.measured.values() for m, _, _ in points)
        return {
            "format": PROFILE_FORMAT,
            "app": self.key[1],
            "init_batch_size": self.limits.init_batch_size,
            "max_batch_size": self.limits.max_batch_size,
            "min_local_bsz": min(smallest, self.limits.init_batch_size),
            "max_local_bsz": {t: limit for t, (limit, _) in sorted(self.measured.items())},
            "seed": seed,
            "description": (
                f"measured by {who} on {', '.join(sorted(self.measured))} in "
                f"{max(now - self.started, 0.0):.0f} s"
            ),
        }

    def meta(self, now: float, who: str) -> dict[str, Any]:
        """When, where and how long the profile was measured (``profile show`` prints it)."""
        return {
            "measured_at": now,
            "started_at": self.started,
            "seconds": max(now - self.started, 0.0),
            "jobs": sorted(self.given),
            "by": who,
            "gpu_types": sorted(self.measured),
        }


def _fingerprint(document: Mapping[str, Any]) -> str:
    """A short digest of a document as read, to tell a new one from the same one again
    (kept across controller restarts: a refusal counts once per document)."""
    text = json.dumps(document, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
