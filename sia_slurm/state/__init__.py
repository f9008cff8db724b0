"""The controller's durable state: one SQLite database under ``state_dir``.

:class:`Store` owns the file and the job/round/decision tables, :class:`Journal` the action
journal (every action committed before it is issued), :mod:`.memory` the controller's memory
(goodput-model inputs, previous allocation, round index) so a new process continues a run.
"""

from sia_slurm.state.codec import CodecError, action_kind
from sia_slurm.state.journal import DONE, FAILED, PENDING, SKIPPED, Journal, JournalEntry
from sia_slurm.state.memory import (
    DEFAULT_REPORTS_PER_SHAPE,
    MEMORY_FORMAT,
    RestoreNote,
    load_memory,
    save_memory,
)
from sia_slurm.state.store import SCHEMA_VERSION, JobRow, RoundRow, Store, StoreError

__all__ = [
    "DEFAULT_REPORTS_PER_SHAPE",
    "DONE",
    "FAILED",
    "MEMORY_FORMAT",
    "PENDING",
    "SCHEMA_VERSION",
    "SKIPPED",
    "CodecError",
    "JobRow",
    "Journal",
    "JournalEntry",
    "RestoreNote",
    "RoundRow",
    "Store",
    "StoreError",
    "action_kind",
    "load_memory",
    "save_memory",
]
