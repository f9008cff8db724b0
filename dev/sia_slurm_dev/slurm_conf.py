"""slurm.conf and gres.conf for a dev cluster: pure text from the spec and the layout.

Facts these rely on (verified on Slurm 22.05; docs/dev-cluster.md): several slurmd on one
host need their own Port=, the host's name as NodeHostname and 127.0.0.1 as NodeAddr; typed GPUs
need gres.conf File= entries or slurmd drops them; CPUs beyond the host's are accepted with
SlurmdParameters=config_overrides.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sia_slurm_dev.spec import DevClusterSpec


@dataclass(frozen=True)
class ClusterLayout:
    """Where a dev cluster keeps its files and which ports and users it uses.

    ``user`` runs the daemons (slurmd stays this user, root in practice: it must switch to each
    job's owner); ``slurm_user``, when given, is Slurm's SlurmUser: slurmctld, started by
    ``user``, drops to it, and Slurm treats it as privileged (the controller's service account).
    """

    root: Path
    hostname: str
    user: str
    port_base: int
    # A requeued job may start again only cred_expire + 1 s after it ended, so this is the floor
    # of every restart on the cluster. Slurm's default is 120 s; 30 s keeps tests quick while
    # leaving credentials time to reach a slurmd on a loaded machine.
    cred_expire_s: int = 30
    slurm_user: str | None = None
    # A node whose slurmd stops answering is set DOWN once SlurmdTimeout has passed since its
    # last answer, at slurmctld's next ping (every third of SlurmdTimeout, each one waiting up
    # to MessageTimeout, 10 s, for a dead node). Slurm's default is 300 s; with 10 s a dead
    # slurmd's node was NOT_RESPONDING after ~14 s and DOWN (its job requeued) after ~26 s (15:
    # 16 s and 28 s; MessageTimeout dominates). A slurmd merely slowed by a loaded machine
    # answers a ping in milliseconds, far inside it.
    slurmd_timeout_s: int = 10
    # Slurm's power saving on some nodes (a test of boots that fail); None: none, as always.
    power_saving: PowerSavingConfig | None = None

    @property
    def controller_user(self) -> str:
        """The user slurmctld runs as (SlurmUser)."""
        return self.slurm_user or self.user

    @property
    def slurm_conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.root / "etc" / "gres.conf"

    @property
    def cgroup_conf(self) -> Path:
        return self.root / "etc" / "cgroup.conf"

    @property
    def prolog(self) -> Path:
        """Slurm's ``Prolog``: fails the next job launch once per :attr:`prolog_failure`."""
        return self.root / "etc" / "prolog.sh"

    @property
    def task_prolog(self) -> Path:
        """Slurm's ``TaskProlog``: gives every task the dev cluster's emulation variables."""
        return self.root / "etc" / "task-prolog.sh"

    @property
    def prolog_failure(self) -> Path:
        """While this file exists, the next job's prolog (on any node) removes it and fails:
        Slurm drains that node ("Prolog error") and requeues the job held
        (``launch_failed_requeued_held``), as a broken node's prolog does."""
        return self.root / "faults" / "prolog-fail"

    @property
    def resume_program(self) -> Path:
        """Slurm's ``ResumeProgram`` (with :attr:`power_saving`): boots nothing."""
        return self.root / "etc" / "resume.sh"

    @property
    def suspend_program(self) -> Path:
        """Slurm's ``SuspendProgram`` (with :attr:`power_saving`): powers nothing down."""
        return self.root / "etc" / "suspend.sh"

    @property
    def bin_dir(self) -> Path:
        """Wrappers running a root's client commands (a release other than the host's)."""
        return self.root / "bin"

    @property
    def munge_key(self) -> Path:
        return self.root / "munge" / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.root / "run" / "munge.socket"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def slurmctld_log(self) -> Path:
        return self.log_dir / "slurmctld.log"

    @property
    def slurmctld_pid(self) -> Path:
        return self.root / "run" / "slurmctld.pid"

    def spool_dir(self, node: str) -> Path:
        """``SlurmdSpoolDir`` of ``node``: its slurmd's state and one socket per job step."""
        return self.root / "spool" / node

    @property
    def gpu_dir(self) -> Path:
        return self.root / "dev"

    @property
    def state_file(self) -> Path:
        return self.root / "cluster.json"

    def slurmd_port(self, index: int) -> int:
        return self.port_base + 1 + index

    def ports(self, spec: DevClusterSpec) -> list[int]:
        return [self.port_base] + [self.slurmd_port(i) for i in range(len(spec.node_names()))]

    def gpu_files(self, node: str, count: int) -> list[Path]:
        return [self.gpu_dir / f"{node}-nvidia{i}" for i in range(count)]


@dataclass(frozen=True)
class PowerSavingConfig:
    """Slurm's power saving on ``nodes`` (every other node is in SuspendExcNodes), for tests
    of a node that fails to boot. Slurm powers nothing down by itself within a test
    (:func:`power_saving_lines`); a test powers a node down with ``scontrol update
    NodeName=X State=POWER_DOWN_FORCE`` (POWERED_DOWN SuspendTimeout later, give or take
    slurmctld's power-save pass) and kills its slurmd (:meth:`DevCluster.kill_slurmd`): the
    power is off. When Slurm allocates the node to a job it runs ResumeProgram, which boots
    nothing, and ResumeTimeout later (plus up to ~10 s) sets the node DOWN ("ResumeTimeout
    reached") and requeues the job (docs/slurm-actuation.md, "A node that fails to boot").
    A node left "powered down" with its slurmd running is taken back by Slurm's next ping
    after the failed boot (ReturnToService=2) and reads IDLE+POWERED_DOWN again."""

    nodes: tuple[str, ...]
    resume_timeout_s: int = 5
    suspend_timeout_s: int = 1


# A hidden partition over every node whose jobs preempt (requeue) the managed partitions'.
PREEMPTING_PARTITION = "urgent"


def render_slurm_conf(spec: DevClusterSpec, layout: ClusterLayout) -> str:
    root = layout.root
    lines = [
        "# Written by `sia-slurm dev-cluster up`; regenerated on every start.",
        "ClusterName=siadev",
        f"SlurmctldHost={layout.hostname}(127.0.0.1)",
        f"SlurmctldPort={layout.port_base}",
        f"SlurmdPort={layout.slurmd_port(0)}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={layout.munge_socket},cred_expire={layout.cred_expire_s}",
        f"SlurmUser={layout.controller_user}",
        f"SlurmdUser={layout.user}",
        f"StateSaveLocation={layout.state_dir}",
        f"SlurmdSpoolDir={layout.spool_dir('%n')}",
        f"SlurmctldPidFile={layout.slurmctld_pid}",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={layout.slurmctld_log}",
        f"SlurmdLogFile={layout.log_dir}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        # sched_interval=1: the main scheduler looks every second, so a job whose requeue delay
        # (cred_expire) has passed starts at once, not at the next 60 s pass.
        "SchedulerParameters=bf_interval=5,sched_interval=1",
        # Daemons that die and come back (DevCluster.kill_* / start_*): a node whose slurmd
        # is gone is DOWN after SlurmdTimeout, and its --requeue jobs are requeued (JobRequeue);
        # ReturnToService=2: a DOWN node is capacity again as soon as its slurmd registers with
        # a valid configuration, whatever set it DOWN (1 would cover "not responding" only),
        # so a restarted slurmd needs no `scontrol update state=resume`. A drained node stays
        # drained until resumed. slurmctld restarted without -c recovers jobs and nodes from
        # StateSaveLocation; what it had not saved yet is lost (it saves a few seconds after
        # an RPC that changes a job, but not after a backfill start: DevCluster.save_state).
        f"SlurmdTimeout={layout.slurmd_timeout_s}",
        "ReturnToService=2",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        "JobRequeue=1",
        "MinJobAge=600",
        "KillWait=10",
        "GresTypes=gpu",
        "SlurmdParameters=config_overrides",
        f"Prolog={layout.prolog}",
        # Every task (the batch script too) gets SIA_DEVCLUSTER_SPEED/_MEMORY from here, whatever
        # the submitter's shell or --export: render_task_prolog says why.
        f"TaskProlog={layout.task_prolog}",
        # Preemption as sites run it: jobs of a higher PriorityTier partition requeue those of
        # the managed partitions (PreemptMode=REQUEUE) on the nodes they need. The hidden
        # partition below is the only higher tier; nothing uses it unless asked.
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        *power_saving_lines(spec, layout),
    ]
    index = 0
    for group in spec.groups:
        cpus = max(4, 2 * group.gpus_per_node)
        for node in group.node_names():
            lines.append(
                f"NodeName={node} NodeHostname={layout.hostname} NodeAddr=127.0.0.1 "
                f"Port={layout.slurmd_port(index)} CPUs={cpus} "
                f"Gres=gpu:{group.gpu_type}:{group.gpus_per_node} State=UNKNOWN"
            )
            index += 1
    for position, group in enumerate(spec.groups):
        default = "YES" if position == 0 else "NO"
        nodes = ",".join(group.node_names())
        lines.append(
            f"PartitionName={group.partition} Nodes={nodes} Default={default} "
            "MaxTime=INFINITE State=UP PriorityTier=1"
        )
    lines.append(
        f"PartitionName={PREEMPTING_PARTITION} Nodes=ALL Default=NO MaxTime=INFINITE State=UP "
        "PriorityTier=10 Hidden=YES"
    )
    return "\n".join(lines) + "\n"


def render_gres_conf(spec: DevClusterSpec, layout: ClusterLayout) -> str:
    lines = [
        "# Written by `sia-slurm dev-cluster up`: fake GPUs, one device file each.",
        "AutoDetect=off",
    ]
    for group in spec.groups:
        for node in group.node_names():
            files = ",".join(str(f) for f in layout.gpu_files(node, group.gpus_per_node))
            lines.append(f"NodeName={node} Name=gpu Type={group.gpu_type} File={files}")
    return "\n".join(lines) + "\n"


def render_cgroup_conf() -> str:
    """cgroup.conf for a release run inside a Debian root (24.11 and later): slurmd 24.11
    refuses to start without a cgroup filesystem ("No filesystem mounted on /sys/fs/cgroup ...
    Unable to initialize cgroup plugin"), and a bound /sys carries none of the host's cgroup
    mounts. The dev cluster tracks processes with proctrack/linuxproc and task/none anyway.
    22.05 on the host needs no cgroup.conf (and reads none)."""
    return (
        "# Written by `sia-slurm dev-cluster up` for a release run inside a Debian root.\n"
        "CgroupPlugin=disabled\n"
    )


def render_prolog(layout: ClusterLayout) -> str:
    """The prolog script: exits 0, unless a test asked for one failure
    (:meth:`DevCluster.fail_next_prolog`); ``mv`` makes exactly one job take it."""
    failure = layout.prolog_failure
    return (
        "#!/bin/sh\n"
        "# Written by `sia-slurm dev-cluster up`: one job launch fails per fail_next_prolog().\n"
        f'mv "{failure}" "{failure}.taken.$SLURM_JOB_ID" 2>/dev/null && exit 1\n'
        "exit 0\n"
    )


def render_task_prolog(variables: Mapping[str, str]) -> str:
    """The TaskProlog script: prints ``export NAME=value`` for each of ``variables``.

    slurmstepd runs it as the job's user before every task, the batch script included, and
    adds each such line of its output to the task's environment (Slurm's documented TaskProlog
    protocol), so the dev cluster's emulation variables (dev/sia_slurm_dev/speed.py) reach
    the training processes however the job was submitted, and no real cluster's jobs ever see
    them. Slurm takes the value verbatim (no shell unquoting), so it must be a plain word.
    """
    lines = [
        "#!/bin/sh",
        "# Written by `sia-slurm dev-cluster up`: the dev cluster's emulation variables.",
    ]
    for name, value in variables.items():
        if not _ENV_NAME.match(name) or not _PLAIN_VALUE.match(value):
            raise ValueError(f"task prolog: {name}={value!r} is not a plain NAME=value")
        lines.append(f"echo export {name}={value}")
    lines.append("exit 0")
    return "\n".join(lines) + "\n"


_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_PLAIN_VALUE = re.compile(r"^[A-Za-z0-9_.,=:+-]*$")


def power_saving_lines(spec: DevClusterSpec, layout: ClusterLayout) -> list[str]:
    """slurm.conf's power saving lines for :attr:`ClusterLayout.power_saving` (none without).

    SuspendTime (any value but INFINITE turns power saving on) is an hour, longer than any
    test: Slurm powers no node down by itself; a test does (``State=POWER_DOWN_FORCE``).
    Every node not named is in SuspendExcNodes."""
    power = layout.power_saving
    if power is None:
        return []
    unknown = sorted(set(power.nodes) - set(spec.node_names()))
    if unknown or not power.nodes:
        raise ValueError(f"power saving: nodes {unknown or '(none)'} are not in {spec}")
    excluded = [node for node in spec.node_names() if node not in power.nodes]
    return [
        f"SuspendProgram={layout.suspend_program}",
        f"ResumeProgram={layout.resume_program}",
        "SuspendTime=3600",
        f"SuspendTimeout={power.suspend_timeout_s}",
        f"ResumeTimeout={power.resume_timeout_s}",
        *([f"SuspendExcNodes={','.join(excluded)}"] if excluded else []),
    ]


def render_power_programs(layout: ClusterLayout) -> list[tuple[Path, str]]:
    """ResumeProgram and SuspendProgram (in slurm.conf only with power saving): both do
    nothing and succeed. A node "powered down" keeps its slurmd unless a test kills it;
    "resumed", that slurmd would register with the host's boot time, older than the resume
    request, so Slurm never takes the node as booted."""
    return [
        (path, f"#!/bin/sh\n# Written by `sia-slurm dev-cluster up`: the {kind} of a fake "
         "power saving.\nexit 0\n")
        for path, kind in ((layout.resume_program, "ResumeProgram"),
                           (layout.suspend_program, "SuspendProgram"))
    ]  # fmt: skip
