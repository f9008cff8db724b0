"""The controller's durable state: one SQLite database under ``state_dir``, and the files beside it.

:class:`Store` owns the file and the job/round/decision tables (:mod:`.schema` the statements
that create and upgrade them, :mod:`.rows` their rows decoded), :class:`Journal` the action
journal (every action committed before it is issued), :mod:`.memory` how the controller's memory
(goodput-model inputs, previous allocation, round index) is kept so a new process continues a
run, :mod:`.profiles` the profiles measured on the site and :mod:`.tree` the state directory.

This package only stores and loads: it imports neither the controller, the policies nor the
goodput model (tests/state/test_pure_storage.py). What is stored is computed by its producers:
:mod:`sia_slurm.service.controller_memory` turns a controller into its memory and back,
:mod:`sia_slurm.service.summary` summarises a round for the ``rounds`` table.
"""

from sia_slurm.state.codec import CodecError, action_kind
from sia_slurm.state.journal import DONE, FAILED, PENDING, SKIPPED, Journal, JournalEntry
from sia_slurm.state.memory import (
    DEFAULT_REPORTS_PER_SHAPE,
    MEMORY_FORMAT,
    ControllerMemory,
    JobMemory,
    RestoreNote,
)
from sia_slurm.state.rows import JobRow, RoundRow
from sia_slurm.state.schema import SCHEMA_VERSION
from sia_slurm.state.store import Store, StoreError

__all__ = [
    "DEFAULT_REPORTS_PER_SHAPE",
    "DONE",
    "FAILED",
    "MEMORY_FORMAT",
    "PENDING",
    "SCHEMA_VERSION",
    "SKIPPED",
    "CodecError",
    "ControllerMemory",
    "JobMemory",
    "JobRow",
    "Journal",
    "JournalEntry",
    "RestoreNote",
    "RoundRow",
    "Store",
    "StoreError",
    "action_kind",
]
