"""The job protocol: the files the controller and a managed job exchange under ``state_dir``.

Both sides import this module, so the formats are defined once (``docs/protocol.md`` describes
them for people). Two trees, by who may write them (``docs/security.md``)::

    control/<sia_id>/assignment.json  by the controller before release      (Assignment)
    control/<sia_id>/stop.json        by the controller to ask for a stop   (StopRequest)
    control/<sia_id>/slurm.json       the controller's record of the job    (backend's own)
    jobs/<sia_id>/spec.json           by sia-sbatch at submission           (JobSpec)
    jobs/<sia_id>/profile.json        by sia-sbatch, a --profile DIR copied (profile_json)
    jobs/<sia_id>/ack-<round>.<run>   by rank 0 after its checkpoint        (empty file)
    jobs/<sia_id>/metrics.json        by rank 0 every ~30 s                 (MetricsReport)
    jobs/<sia_id>/exit-<run>.json     by the launcher when a run ends       (RunExit)
    jobs/<sia_id>/refusal-<run>.json  by the launcher that will not train   (RunRefusal)

``control/`` belongs to the controller's account and users can only read it; ``jobs/`` is
sticky and world-writable (like /tmp), each ``jobs/<sia_id>/`` belongs to the job's user. The
controller never writes under ``jobs/`` and reads it only through :mod:`sia_slurm.userfiles`.

Every file is written atomically (temporary file in the same directory, fsync, rename:
:mod:`sia_slurm.safefiles`), so a reader sees either the old or the new content, never a torn
one. Every reader validates the whole file and raises :class:`ProtocolError` naming the file
and the field; nothing here guesses a default for a missing field except the ones documented
on each dataclass.

Four modules, by what they hold: :mod:`~sia_slurm.protocol.paths` (where each file lives, and
the names that carry a Slurm run), :mod:`~sia_slurm.protocol.documents` (the dataclasses),
:mod:`~sia_slurm.protocol.bounds` (what every field may hold, and the docs' table of it) and
:mod:`~sia_slurm.protocol.document_json` (a document to and from JSON, its file read and
written). Both sides import their names from here, ``sia_slurm.protocol``, as before. Three
more, for the profiles, are imported by their own names (each imports this package):
:mod:`~sia_slurm.protocol.observation` (one measured step), :mod:`~sia_slurm.protocol.profile`
(the profile directories of ``profiles/`` and ``--profile DIR``) and
:mod:`~sia_slurm.protocol.profile_json` (``profile.json`` and ``profiled.json``).
"""

from __future__ import annotations

from sia_slurm.protocol.bounds import (
    FIELD_BOUNDS,
    HOST,
    JOB_ID,
    MAX_ACCUM,
    MAX_BATCH,
    MAX_COUNT,
    MAX_GPUS,
    MAX_GRAD_STAT,
    MAX_RESTARTS,
    MAX_SECONDS,
    MAX_STEP_SECONDS,
    MAX_SWEEP,
    MAX_UID,
    NAME,
    Bound,
    bounds_table,
)
from sia_slurm.protocol.document_json import from_json, read_document, to_json, write_document
from sia_slurm.protocol.documents import (
    MAX_FAILURES,
    MAX_MESSAGE_CHARS,
    OLDEST_PROTOCOL,
    PROTOCOL_VERSION,
    Assignment,
    Document,
    ExitCause,
    JobKind,
    JobSpec,
    MetricsReport,
    RunExit,
    RunRefusal,
    StopRequest,
)
from sia_slurm.protocol.paths import (
    METRICS_FILE,
    PROFILE_FILE,
    PROFILED_FILE,
    SIA_ID,
    SPEC_FILE,
    StatePaths,
    ack_name,
    check_sia_id,
    exit_name,
    refusal_name,
)
from sia_slurm.safefiles import ProtocolError

__all__ = [
    "FIELD_BOUNDS",
    "HOST",
    "JOB_ID",
    "MAX_ACCUM",
    "MAX_BATCH",
    "MAX_COUNT",
    "MAX_FAILURES",
    "MAX_GPUS",
    "MAX_GRAD_STAT",
    "MAX_MESSAGE_CHARS",
    "MAX_RESTARTS",
    "MAX_SECONDS",
    "MAX_STEP_SECONDS",
    "MAX_SWEEP",
    "MAX_UID",
    "METRICS_FILE",
    "NAME",
    "OLDEST_PROTOCOL",
    "PROFILED_FILE",
    "PROFILE_FILE",
    "PROTOCOL_VERSION",
    "SIA_ID",
    "SPEC_FILE",
    "Assignment",
    "Bound",
    "Document",
    "ExitCause",
    "JobKind",
    "JobSpec",
    "MetricsReport",
    "ProtocolError",
    "RunExit",
    "RunRefusal",
    "StatePaths",
    "StopRequest",
    "ack_name",
    "bounds_table",
    "check_sia_id",
    "exit_name",
    "from_json",
    "read_document",
    "refusal_name",
    "to_json",
    "write_document",
]
