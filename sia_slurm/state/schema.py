"""The state database's tables: the statements that create them, and those that upgrade them.

Kept apart from the queries (:mod:`sia_slurm.state.store`) because the two change for
different reasons: a column added here needs a migration step here, read by every later
release, while a query can change in any release. The version of a database is SQLite's
``PRAGMA user_version``; :func:`upgrade_statements` says what takes an older one to this one.
"""

from __future__ import annotations

SCHEMA_VERSION = 4

# The statements that take a database of version N to N + 1 (index N - 1), each in place.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 2: a decision keeps its predicted throughput apart from its goodput (Decision.throughput);
    # the rounds decided before read 0 there, "not kept".
    ("ALTER TABLE decisions ADD COLUMN throughput REAL NOT NULL DEFAULT 0",),
    # 3: whose job it is, as Slurm says (the dashboard's user and account): jobs seen before
    # read '' until their next snapshot.
    (
        "ALTER TABLE jobs ADD COLUMN user TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE jobs ADD COLUMN account TEXT NOT NULL DEFAULT ''",
    ),
    # 4: the policy's memory (controller.allocation) may be memory format 3, a JSON document
    # (sia_slurm/state/memory.py), which the releases of schema 3 cannot read: 0.1.0 read it as
    # a pickle it did not know and started its policy fresh on a database it kept writing. No
    # table changes; the version is what makes such a release refuse the database (a
    # downgrade, docs/operations.md "Upgrading").
    (),
)
assert len(MIGRATIONS) == SCHEMA_VERSION - 1

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE jobs (
    sia_id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    phase TEXT NOT NULL,
    phase_history TEXT NOT NULL,
    slurm_job_ids TEXT NOT NULL,
    submit_time REAL,
    first_start REAL,
    finish_time REAL,
    restarts INTEGER NOT NULL DEFAULT 0,
    config TEXT,
    placement TEXT,
    batch TEXT,
    message TEXT NOT NULL DEFAULT '',
    last_seen REAL,
    remembered INTEGER NOT NULL DEFAULT 0,
    admitted_round INTEGER,
    max_gpus_seen INTEGER NOT NULL DEFAULT 0,
    reports_seen INTEGER NOT NULL DEFAULT 0,
    last_report_time REAL,
    user TEXT NOT NULL DEFAULT '',
    account TEXT NOT NULL DEFAULT ''
);
CREATE TABLE rounds (
    round_index INTEGER PRIMARY KEY,
    time REAL NOT NULL,
    wall_time REAL NOT NULL,
    dry_run INTEGER NOT NULL,
    timings TEXT NOT NULL,
    solve_status TEXT NOT NULL,
    solve_seconds REAL NOT NULL,
    solve_message TEXT NOT NULL,
    gpus TEXT NOT NULL,
    jobs_by_phase TEXT NOT NULL,
    rejected TEXT NOT NULL
);
CREATE TABLE decisions (
    round_index INTEGER NOT NULL,
    sia_id TEXT NOT NULL,
    phase TEXT NOT NULL,
    action TEXT NOT NULL,
    before TEXT NOT NULL,
    after TEXT NOT NULL,
    batch_size INTEGER NOT NULL,
    local_bsz INTEGER NOT NULL,
    accum_steps INTEGER NOT NULL,
    goodput REAL NOT NULL,
    note TEXT NOT NULL,
    throughput REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (round_index, sia_id)
);
CREATE INDEX decisions_by_job ON decisions (sia_id, round_index);
CREATE TABLE actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    round_index INTEGER NOT NULL,
    sia_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'done', 'failed', 'skipped')),
    message TEXT NOT NULL DEFAULT '',
    attempts INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    finished REAL
);
CREATE INDEX actions_by_state ON actions (state, id);
CREATE TABLE reports (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sia_id TEXT NOT NULL,
    round_index INTEGER NOT NULL,
    shape TEXT NOT NULL,
    report TEXT NOT NULL
);
CREATE INDEX reports_by_shape ON reports (sia_id, shape, id);
CREATE TABLE controller (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    format INTEGER NOT NULL,
    sia_version TEXT NOT NULL,
    policy TEXT NOT NULL,
    round_index INTEGER NOT NULL,
    allocation BLOB,
    saved REAL NOT NULL
);
"""


def upgrade_statements(version: int) -> list[str]:
    """The statements, in order, that take a database of schema ``version`` (0: empty) to
    :data:`SCHEMA_VERSION`, each in place; the caller runs them in one transaction (and
    refuses a newer database before it asks)."""
    if version == 0:
        # One statement at a time: executescript would commit the caller's open transaction.
        return [statement for statement in SCHEMA.split(";") if statement.strip()]
    return [statement for step in MIGRATIONS[version - 1 :] for statement in step]
