"""What Slurm accounting says about shares and GPU limits, for the policy (issue 20).

With slurmdbd (``AccountingStorageType=accounting_storage/slurmdbd``) the site's associations
carry each account's and user's fair share (``Share``) and GPU limits (``GrpTRES=gres/gpu=N``,
``MaxTRESPerJob``), and its QOS more limits (``GrpTRES``, ``MaxTRESPerUser``, ``MaxTRESPerJob``).
:class:`AccountingReader` reads them with ``sacctmgr -n -P`` (parsable output, the same on every
release: ``sacctmgr`` has no ``--json`` on 22.05) every few minutes; the parsers are pure and
tested against captured output (``tests/fixtures/slurm-22.05/sacctmgr-*.txt``).

:class:`~sia_slurm.policy.site_accounting.SiteAccounting` turns that into the policy's terms:
shares (the association shares replace the config's ``shares:``) and, for this round's live
jobs, GPU limits. Without accounting the reader returns ``None`` and everything works as
without Slurm limits, with the config's shares (equal shares per user by default).

Limits are read for ``gres/gpu`` as a whole and per GPU type (``gres/gpu:a100=2``, as
sacctmgr prints a typed TRES; Slurm enforces it only where ``AccountingStorageTRES`` names the
type): a typed limit counts only the GPUs of that type (:class:`~sia_slurm.policy.limits.
GpuLimit`).
"""

from __future__ import annotations

import functools
import logging
import pwd
import re
from collections.abc import Sequence
from dataclasses import dataclass

from sia_slurm.policy.site_accounting import Association, QosLimits, SiteAccounting
from sia_slurm.slurm.runner import CommandError, CommandRunner

logger = logging.getLogger(__name__)

ASSOC_FIELDS = "Cluster,Account,User,ParentName,Share,GrpTRES,MaxTRESPerJob,QOS"
QOS_FIELDS = "Name,GrpTRES,MaxTRESPU,MaxTRESPerJob"
SHOW_ASSOC = ("sacctmgr", "-n", "-P", "show", "assoc", f"format={ASSOC_FIELDS}")
SHOW_QOS = ("sacctmgr", "-n", "-P", "show", "qos", f"format={QOS_FIELDS}")
SHOW_CONFIG = ("scontrol", "show", "config")
SACCT_FIELDS = "JobID,Comment,Account,User,AllocTRES,ElapsedRaw,State"
_GPU = re.compile(r"(?:^|,)gres/gpu=(\d+)(?:,|$)")
_TYPED_GPU = re.compile(r"(?:^|,)gres/gpu:([^=,]+)=(\d+)(?=,|$)")


class AccountingParseError(ValueError):
    """sacctmgr printed something the parser does not understand (the message quotes it)."""


def gpu_count(tres: str) -> int | None:
    """The untyped ``gres/gpu=N`` of a TRES list (``cpu=4,gres/gpu=2``); None without one."""
    match = _GPU.search(tres.strip())
    return None if match is None else int(match[1])


def typed_gpu_counts(tres: str) -> tuple[tuple[str, int], ...]:
    """The per-type ``gres/gpu:TYPE=N`` of a TRES list (``gres/gpu=4,gres/gpu:a100=2``), as
    ``(type, N)`` pairs sorted by type; empty without any."""
    return tuple(sorted((m[1], int(m[2])) for m in _TYPED_GPU.finditer(tres.strip())))


def _fields(text: str, count: int, what: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != count:
            raise AccountingParseError(
                f"sacctmgr show {what}: expected {count} '|'-separated fields, got {line!r}"
            )
        rows.append(parts)
    return rows


def _share(text: str, line: Sequence[str]) -> int:
    if text in ("", "parent"):  # "parent": the user shares its account's part (1 here)
        return 1
    try:
        return max(int(text), 0)
    except ValueError:
        raise AccountingParseError(f"sacctmgr show assoc: Share {text!r} in {line!r}") from None


def parse_associations(text: str) -> tuple[Association, ...]:
    """``sacctmgr -n -P show assoc format=`` :data:`ASSOC_FIELDS`."""
    associations = []
    for row in _fields(text, 8, "assoc"):
        cluster, account, user, parent, share, grp, per_job, qos = row
        associations.append(
            Association(
                cluster=cluster,
                account=account,
                user=user,
                parent=parent,
                share=_share(share, row),
                grp_gpus=gpu_count(grp),
                max_gpus_per_job=gpu_count(per_job),
                qos=tuple(q for q in qos.split(",") if q),
                grp_typed=typed_gpu_counts(grp),
                per_job_typed=typed_gpu_counts(per_job),
            )
        )
    return tuple(associations)


def parse_qos(text: str) -> dict[str, QosLimits]:
    """``sacctmgr -n -P show qos format=`` :data:`QOS_FIELDS`."""
    return {
        name: QosLimits(
            gpu_count(grp),
            gpu_count(per_user),
            gpu_count(per_job),
            grp_typed=typed_gpu_counts(grp),
            per_user_typed=typed_gpu_counts(per_user),
            per_job_typed=typed_gpu_counts(per_job),
        )
        for name, grp, per_user, per_job in _fields(text, 4, "qos")
    }


def sacct_runs(since: str = "now-30days") -> list[str]:
    """Every run of every job since ``since``: ``-D`` lists each run of a requeued job (one
    Slurm job id, several runs), ``-X`` leaves out the steps."""
    return ["sacct", "-a", "-X", "-n", "-P", "-D", "-S", since, "-o", SACCT_FIELDS]


def parse_runs(text: str, marker: str) -> list[tuple[str, int, int]]:
    """``(sia_id, GPUs, elapsed seconds)`` of every run in :func:`sacct_runs` output whose
    comment is ``<marker>:<sia_id>``, whichever Slurm job id it ran under (a moved job is
    requeued or resubmitted; ``AccountingStoreFlags=job_comment`` keeps each run's comment)."""
    prefix = f"{marker}:"
    rows = _fields(text, 7, "sacct")
    # 22.05 stores a requeued job's comment with each run once it ends; the run in progress
    # has none yet, so it takes the sia id of its job's other runs.
    owner = {r[0]: r[1][len(prefix) :] for r in rows if r[1].startswith(prefix)}
    runs = []
    for row in rows:
        job_id, comment, _, _, tres, elapsed, _ = row
        if comment.startswith(prefix):
            sia_id = comment[len(prefix) :]
        elif not comment and job_id in owner:
            sia_id = owner[job_id]
        else:
            continue
        try:
            seconds = int(elapsed)
        except ValueError:
            raise AccountingParseError(f"sacct: ElapsedRaw {elapsed!r} in {row!r}") from None
        runs.append((sia_id, gpu_count(tres) or 0, seconds))
    return runs


def parse_gpu_hours(text: str, marker: str) -> dict[str, float]:
    """GPU-hours per sia job: each run's allocated GPUs times its elapsed time, summed."""
    hours: dict[str, float] = {}
    for sia_id, gpus, seconds in parse_runs(text, marker):
        hours[sia_id] = hours.get(sia_id, 0.0) + gpus * seconds / 3600
    return hours


def parse_run_seconds(text: str, marker: str) -> dict[str, float]:
    """Run time per sia job over all its runs (seconds)."""
    used: dict[str, float] = {}
    for sia_id, _, seconds in parse_runs(text, marker):
        used[sia_id] = used.get(sia_id, 0.0) + seconds
    return used


def accounted_gpu_hours(runner: CommandRunner, marker: str) -> dict[str, float] | None:
    """GPU-hours per sia job as Slurm accounting has them; None without accounting or when
    sacct fails (the caller says so)."""
    result = runner.run(list(SHOW_CONFIG), check=False)
    if result.returncode != 0 or not accounting_enabled(result.stdout):
        return None
    try:
        return parse_gpu_hours(runner.run(sacct_runs()).stdout, marker)
    except (CommandError, AccountingParseError) as exc:
        logger.warning("sacct failed: %s", exc)
        return None


@functools.lru_cache(maxsize=4096)
def user_name(uid: int) -> str:
    """The login name of ``uid`` (the name associations use), or the number when unknown."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def accounting_enabled(config_text: str) -> bool:
    """Whether ``scontrol show config`` names slurmdbd as the accounting storage."""
    match = re.search(r"^AccountingStorageType\s*=\s*(\S+)", config_text, re.MULTILINE)
    return match is not None and match[1].endswith("slurmdbd")


@dataclass
class AccountingReader:
    """Reads :class:`SiteAccounting` every ``refresh_s`` seconds (associations change
    rarely; sacctmgr asks slurmdbd, not slurmctld). A failed read keeps the last one and is
    logged; ``None`` when the cluster has no accounting."""

    runner: CommandRunner
    refresh_s: float = 300.0
    _enabled: bool | None = None
    _last: SiteAccounting | None = None
    _read_at: float = float("-inf")

    def enabled(self) -> bool:
        if self._enabled is None:
            result = self.runner.run(list(SHOW_CONFIG), check=False)
            self._enabled = result.returncode == 0 and accounting_enabled(result.stdout)
        return self._enabled

    def read(self, now: float) -> SiteAccounting | None:
        if not self.enabled():
            return None
        if self._last is not None and now - self._read_at < self.refresh_s:
            return self._last
        try:
            associations = parse_associations(self.runner.run(list(SHOW_ASSOC)).stdout)
            qos = parse_qos(self.runner.run(list(SHOW_QOS)).stdout)
        except (CommandError, AccountingParseError) as exc:
            logger.warning("reading Slurm's associations failed (%s); keeping the last read", exc)
            return self._last
        self._last, self._read_at = SiteAccounting(associations, qos), now
        return self._last
