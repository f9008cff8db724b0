"""Every key of the controller's config file, with its type, default and meaning.

One table serves the loader and the documentation: :mod:`sia_slurm.config` takes the keys it
accepts (and those it requires) in each mapping from here, and the reference page
(docs/reference/config.md) and ``sia-slurm config keys`` are rendered from it, so a key cannot
be accepted without being documented, nor documented without being accepted. The sections that
are filled from a dataclass (``restart``, ``slurm``, each policy's parameters) list that
dataclass's fields here too, with its defaults; tests/test_config_keys.py checks both against the
dataclasses.

A path is dotted; ``<name>`` stands for a name the site chooses (a GPU type, a partition, an
account, a user).

Keys leave this table through :data:`RETIRED`, never silently: a config written for the release
before still loads, with a warning, for one release (:mod:`sia_slurm.config_evolution`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

REQUIRED: Any = object()
"""The default of a key that has none: it must be given."""

NO_DEFAULT: Any = object()
"""The default of a mapping whose keys are the site's own names (nothing when absent)."""

CONFIG_VERSION = 1
"""The newest ``config_version`` this sia-slurm reads. Raised only when a release changes what
a file means in a way a rename cannot say (a key whose value is read differently): an older
sia-slurm then refuses the newer file with a message instead of misreading it. Renamed and
removed keys do not raise it; :data:`RETIRED` carries them."""


@dataclass(frozen=True)
class ConfigKey:
    """One key: ``path`` (dotted), the kind of value, its default and what it does."""

    path: str
    kind: str
    default: Any
    doc: str
    policy: str = ""  # for policy parameters: the policy whose dataclass holds it

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def parent(self) -> str:
        return self.path.rpartition(".")[0]


def _yaml(value: Any) -> str:
    """A default as it would be written in the file."""
    if value is REQUIRED:
        return "(required)"
    if value is NO_DEFAULT:
        return "(none)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if value == "" else value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


KEYS: tuple[ConfigKey, ...] = (
    # ---- top level
    ConfigKey(
        "config_version",
        "integer >= 1",
        CONFIG_VERSION,
        "The version of the file's format it was written for. A file newer than this "
        "sia-slurm reads is refused with a message saying so, rather than half understood.",
    ),
    ConfigKey(
        "round_seconds", "number > 0", 60.0, "Length of one scheduling round (the paper's 60 s)."
    ),
    ConfigKey(
        "state_dir",
        "directory",
        REQUIRED,
        "The controller's state: its SQLite database (`sia.db`), the controller-owned `control/` "
        "tree (assignments, stop requests) and the users' `jobs/` tree (specs, metrics, "
        "checkpoints). On a filesystem the controller host and every compute node share; made "
        "by `sia-slurm setup`. A relative path is relative to the config file.",
    ),
    ConfigKey(
        "managed_marker",
        "word",
        "sia-slurm",
        "The word `sia-sbatch` puts in a job's Slurm comment (`<marker>:<id>`); the controller "
        "never touches a job without it.",
    ),
    ConfigKey(
        "dry_run",
        "boolean",
        False,
        "Observe and decide every round, log the actions that would be taken, change nothing "
        "in Slurm. Start a new site with `true`.",
    ),
    ConfigKey(
        "gpu_types",
        "mapping",
        NO_DEFAULT,
        "The GPU types the scheduler knows; optional: a type a partition names is known anyway.",
    ),
    ConfigKey(
        "gpu_types.<type>.profile",
        "profile key",
        "<type>",
        "The type's key in the throughput profiles (`profiles/`: `dgx` for A100, `rtx`, `t4`, "
        "`quad`, `v100`).",
    ),
    ConfigKey(
        "partitions",
        "mapping",
        REQUIRED,
        "One Slurm partition per GPU type: partition name -> its GPU type and GPUs per node. "
        "Every node of the partition must carry `Gres=gpu:<gpu_type>:<gpus_per_node>` "
        "(`config check --live` verifies it).",
    ),
    ConfigKey("partitions.<partition>.gpu_type", "GPU type", REQUIRED, "The partition's GPU type."),
    ConfigKey(
        "partitions.<partition>.gpus_per_node",
        "integer > 0",
        REQUIRED,
        "GPUs on each of its nodes.",
    ),
    ConfigKey(
        "policy",
        "mapping",
        NO_DEFAULT,
        "The allocation policy: `name`, then the parameters of that policy (below).",
    ),
    ConfigKey(
        "policy.name",
        "sia, sia-paper, pollux, gavel, fifo",
        "sia",
        "Which policy runs each round (`sia-paper`: the paper's Sia exactly).",
    ),
    # ---- Sia (sia_slurm.policy.parameters.SiaPolicyConfig)
    ConfigKey(
        "policy.p",
        "number != 0",
        -0.25,
        "Fairness power: the objective is the sum of `G^p`; p < 0 favours the worst-off jobs "
        "(the paper's -0.5 in `sia-paper`).",
        "sia",
    ),
    ConfigKey(
        "policy.lambda_n",
        "number",
        1.1,
        "Penalty for leaving a job without GPUs; its sign opposite to `p`, `|lambda_n| > 1`.",
        "sia",
    ),
    ConfigKey(
        "policy.lambda_a",
        "number >= 0",
        0.0,
        "Penalty for changing a job's allocation (0 in the paper's simulator, 0.01 on its "
        "physical cluster and in `etc/sia.yaml`).",
        "sia",
    ),
    ConfigKey(
        "policy.growth_factor",
        "number >= 1 or null",
        4.0,
        "A job may run on at most this multiple of the most GPUs it has run on (null: no cap; "
        "the paper's 2 in `sia-paper`).",
        "sia",
    ),
    ConfigKey(
        "policy.first_gpus",
        "integer >= 1",
        1,
        "The growth cap before a job's first run: the most GPUs it may start on.",
        "sia",
    ),
    ConfigKey(
        "policy.default_restart_cost",
        "seconds >= 0",
        30.0,
        "Restart cost S charged by the restart factor until a job has measured its own "
        "(`sia-sbatch --restart-cost` sets a job's).",
        "sia",
    ),
    ConfigKey(
        "policy.max_normalised_goodput",
        "number > 1 or null",
        3000.0,
        "Clip of each job's row-normalised goodput (the artifact's 3000), so `G^p` stays well "
        "scaled.",
        "sia",
    ),
    ConfigKey(
        "policy.time_limit_s",
        "seconds > 0",
        5.0,
        "HiGHS's time limit per round; on timeout the best answer found is used.",
        "sia",
    ),
    ConfigKey(
        "policy.mip_rel_gap", "number >= 0", 1e-4, "HiGHS's own gap where it searches.", "sia"
    ),
    ConfigKey(
        "policy.accept_gap",
        "0 <= number < 1",
        1e-3,
        "A round's answer within this relative distance of the LP bound is taken without "
        "proving it optimal (0: prove every round).",
        "sia",
    ),
    ConfigKey(
        "policy.charge_waiting",
        "true or false",
        False,
        "The restart factor also discounts a job that holds no GPUs (the paper's rule: a job "
        "requeued or stopped counts its restarts against every start).",
        "sia",
    ),
    ConfigKey(
        "policy.charge_requeues",
        "true or false",
        False,
        "The restart factor also counts the restarts the cluster made on its own (Slurm "
        "requeued the job after a node failure or a preemption), not only those the "
        "controller asked for (the paper's rule counts every restart).",
        "sia",
    ),
    ConfigKey(
        "policy.repair_placement",
        "true or false",
        True,
        "An allocation placement cannot honour falls back in the same round to the job's "
        "current configuration, or a smaller one of its type, that fits.",
        "sia",
    ),
    # ---- Pollux (PolluxPolicyConfig)
    ConfigKey("policy.p", "number != 0", -1.0, "Fairness power of the genetic search.", "pollux"),
    ConfigKey(
        "policy.restart_cost", "seconds", 30.0, "Restart cost charged for a change.", "pollux"
    ),
    ConfigKey("policy.population", "integer >= 2", 100, "Population of the search.", "pollux"),
    ConfigKey("policy.generations", "integer >= 0", 100, "Generations per round.", "pollux"),
    ConfigKey(
        "policy.max_nodes_per_job", "integer", 16, "The most nodes one job may span.", "pollux"
    ),
    ConfigKey(
        "policy.growth_factor",
        "number or null",
        2.0,
        "A job may run on at most this multiple of the most GPUs it has run on.",
        "pollux",
    ),
    ConfigKey("policy.mutation_rate", "number", 0.1, "Mutation rate of the search.", "pollux"),
    ConfigKey("policy.seed", "integer", 0, "Seed of the search.", "pollux"),
    ConfigKey(
        "policy.reference_type",
        "GPU type or null",
        None,
        "The one GPU type Pollux scores every job on (null: the first type).",
        "pollux",
    ),
    # ---- Gavel (GavelPolicyConfig)
    ConfigKey(
        "policy.objective",
        "max_sum_throughput, max_min_fairness, max_total_throughput",
        "max_sum_throughput",
        "The LP's objective: the Sia artifact's raw throughput sum, Gavel's paper default, or "
        "the normalised sum.",
        "gavel",
    ),
    ConfigKey(
        "policy.round_duration",
        "seconds > 0",
        360.0,
        "Seconds between Gavel's decisions (the artifact's 360).",
        "gavel",
    ),
    ConfigKey(
        "policy.workers",
        "even, any",
        "even",
        "`even`: the same GPUs on every node a job spans (what one Slurm job can ask for); "
        "`any`: free GPUs anywhere on the type, as the artifact's simulator runs Gavel.",
        "gavel",
    ),
    ConfigKey(
        "policy.water_filling",
        "boolean",
        True,
        "With `max_min_fairness`: water-fill as Gavel's hierarchical policy does; false keeps "
        "its first LP alone.",
        "gavel",
    ),
    # ---- FIFO (FifoPolicyConfig)
    ConfigKey(
        "policy.backfill",
        "boolean",
        False,
        "Let later jobs start when an earlier one does not fit.",
        "fifo",
    ),
    # ---- restart (sia_slurm.config.RestartConfig)
    ConfigKey("restart", "mapping", NO_DEFAULT, "How stops and failed runs are handled."),
    ConfigKey(
        "restart.checkpoint_timeout_s",
        "seconds >= 0",
        120.0,
        "How long the controller waits for a job to acknowledge its checkpoint before it "
        "requeues it anyway.",
    ),
    ConfigKey(
        "restart.max_slurm_failures",
        "integer >= 0",
        10,
        "Runs of one job that Slurm may end (a failed node, a refused launch) and the job still "
        "come back from its checkpoint; the job's own failures count against "
        "`sia-sbatch --max-failures`.",
    ),
    # ---- slurm (sia_slurm.config.SlurmConfig)
    ConfigKey("slurm", "mapping", NO_DEFAULT, "How the controller talks to Slurm."),
    ConfigKey(
        "slurm.backend",
        "cli, pyslurm",
        "cli",
        "`cli`: Slurm's commands (`scontrol`, `squeue --json`); `pyslurm`: the optional "
        "binding (untested: PyPI's matches none of the verified releases).",
    ),
    ConfigKey(
        "slurm.bin_dir",
        "directory or empty",
        "",
        "Where the Slurm commands are; empty: search `PATH`.",
    ),
    # ---- shares
    ConfigKey(
        "shares",
        "mapping",
        NO_DEFAULT,
        "Fair shares between accounts and users. Absent: every user the same share; with Slurm "
        "accounting the association shares are used instead.",
    ),
    ConfigKey("shares.accounts", "mapping", NO_DEFAULT, "Account -> its share of the cluster."),
    ConfigKey("shares.accounts.<account>", "number > 0", REQUIRED, "The account's share."),
    ConfigKey("shares.users", "mapping", NO_DEFAULT, "User -> its account and share within it."),
    ConfigKey("shares.users.<user>.account", "Slurm account", None, "The user's account."),
    ConfigKey("shares.users.<user>.share", "number > 0", 1.0, "The user's share in its account."),
    ConfigKey(
        "shares.default_share", "number > 0", 1.0, "The share of accounts and users not listed."
    ),
    ConfigKey(
        "shares.usage_half_life_s",
        "seconds > 0",
        3600.0,
        "How long past GPU time counts in the usage factor.",
    ),
    ConfigKey(
        "shares.usage_factor_limit",
        "number >= 1",
        8.0,
        "Clip of the usage factors that correct each account's share by its recent shortfall; "
        "1: static shares only.",
    ),
)
# The paper's Sia (`policy.name: sia-paper`) takes Sia's keys, with its own defaults.
_SIA_PAPER_DEFAULTS = {
    "p": -0.5,
    "growth_factor": 2.0,
    "charge_waiting": True,
    "charge_requeues": True,
    "repair_placement": False,
}
KEYS += tuple(
    replace(key, policy="sia-paper", default=_SIA_PAPER_DEFAULTS.get(key.name, key.default))
    for key in KEYS
    if key.policy == "sia"
)


@dataclass(frozen=True)
class RetiredKey:
    """A key a release took out of :data:`KEYS`: renamed (``replaced_by``, a path in KEYS with
    the same ``<name>`` placeholders) or removed (``replaced_by`` None; ``why`` says why its
    value no longer matters). In the release that retired it (``retired_in``, and that
    release's patch releases) the loader still reads it, with a warning; from the next minor
    release on it is an error naming the new key, so a site has one release to edit its file
    and never finds a setting silently dropped."""

    path: str
    retired_in: str
    replaced_by: str | None
    why: str = ""


RETIRED: tuple[RetiredKey, ...] = ()
"""Every retired key, oldest first. Empty: no key has been renamed or removed since the first
release (0.1.0; the renames before it, e.g. ``policy.max_growth`` to ``growth_factor``, never
reached a site)."""


def keys_under(parent: str, policy: str = "") -> dict[str, ConfigKey]:
    """The keys directly under ``parent`` (``""``: the top level), by name; under ``policy``
    the named policy's parameters (and ``name``), elsewhere no policy's."""
    found: dict[str, ConfigKey] = {}
    for key in KEYS:
        if key.parent == parent and key.policy in ("", policy):
            found[key.name] = key
    return found


def default(path: str) -> Any:
    """The default of the key at ``path`` (a KeyError for a key not in :data:`KEYS`)."""
    for key in KEYS:
        if key.path == path and not key.policy:
            return key.default
    raise KeyError(path)


def _rows(keys: list[ConfigKey]) -> Iterator[str]:
    yield "| key | value | default | meaning |"
    yield "|---|---|---|---|"
    for key in keys:
        doc = key.doc.replace("|", "\\|")
        shown = _yaml(key.default)
        if key.default not in (REQUIRED, NO_DEFAULT):
            shown = f"`{shown}`"
        yield f"| `{key.path}` | {key.kind} | {shown} | {doc} |"


def reference_markdown() -> str:
    """The reference of every key, as Markdown tables: one for the file's own keys, one per
    policy's parameters (docs/reference/config.md, ``sia-slurm config keys``)."""
    lines = ["## The file", ""]
    lines += _rows([key for key in KEYS if not key.policy])
    for policy in ("sia", "sia-paper", "pollux", "gavel", "fifo"):
        lines += ["", f"## `policy.name: {policy}`", ""]
        lines += _rows([key for key in KEYS if key.policy == policy])
    if RETIRED:  # read with a warning in their release, refused from the next
        lines += ["", "## Retired keys", "", "| key | retired in | now |", "|---|---|---|"]
        for old in RETIRED:
            now = f"`{old.replaced_by}`" if old.replaced_by else f"removed: {old.why}"
            now = now.replace("|", "\\|")
            lines.append(f"| `{old.path}` | {old.retired_in} | {now} |")
    return "\n".join(lines) + "\n"
