"""One run as sia-launch judges it (sia_slurm/job/runs.py): the controller's files it reads, the
evidence the job side leaves, the verdict, and the rendezvous port."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from sia_slurm.job.runs import (
    EXIT_ABORTED,
    RDZV_PORTS,
    RunError,
    RunEvidence,
    TrainingRecord,
    agent_options,
    await_successor,
    clear_evidence,
    mark_rendezvous_failure,
    mark_task,
    read_evidence,
    reserve_port,
    run_end,
    slurm_ended,
    stopped_on_request,
    superseded_by,
    write_training,
)
from sia_slurm.protocol import (
    ExitCause,
    MetricsReport,
    StatePaths,
    StopRequest,
    write_document,
)
from sia_slurm.slurm.runner import CommandError, CommandResult
from tests.job.test_launch import assignment  # job 41 after one restart
from tests.release import quiet_ports


def test_exit_status_says_stopped_only_for_an_acknowledged_later_stop(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    paths.job_dir("s1-abcd").mkdir(parents=True)  # the job's (sia-sbatch made it)
    run = ("41", 1)  # job 41 after one restart
    assert not stopped_on_request(paths, "s1-abcd", 7, *run)
    write_document(paths.stop_request("s1-abcd"), StopRequest("s1-abcd", 7))
    paths.ack("s1-abcd", 7, "41", 1).touch()
    assert not stopped_on_request(paths, "s1-abcd", 7, *run)  # the stop before this start
    write_document(paths.stop_request("s1-abcd"), StopRequest("s1-abcd", 8))
    assert not stopped_on_request(paths, "s1-abcd", 7, *run)  # requested, not acknowledged
    paths.ack("s1-abcd", 8, "41", 0).touch()
    assert not stopped_on_request(paths, "s1-abcd", 7, *run)  # by the run before: not this one
    paths.ack("s1-abcd", 8, "41", 1).touch()
    assert stopped_on_request(paths, "s1-abcd", 7, *run)


def test_a_run_is_superseded_only_by_an_assignment_for_another_run(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    run = ("41", 1)  # job 41 after one restart
    assert superseded_by(paths, "s1-abcd", *run) is None  # no assignment at all
    write_document(paths.assignment("s1-abcd"), assignment(round_index=8))
    assert superseded_by(paths, "s1-abcd", *run) is None  # a rebatch of this very run
    write_document(paths.assignment("s1-abcd"), assignment(slurm_job_id=""))
    assert superseded_by(paths, "s1-abcd", *run) is None  # names no run: proves nothing
    for job_id, restarts in (("41", 2), ("42", 1)):  # the next run; a resubmitted job
        write_document(
            paths.assignment("s1-abcd"),
            assignment(round_index=9, slurm_job_id=job_id, slurm_restart_count=restarts),
        )
        successor = superseded_by(paths, "s1-abcd", *run)
        assert successor is not None and successor.round_index == 9


def test_a_run_is_superseded_by_its_own_identity_on_other_nodes(tmp_path: Path) -> None:
    """A slurmctld killed right after a launch comes back from the state it saved before and
    launches the same job id and restart count again, elsewhere (seen on 24.11): the run on
    the first nodes must take the new assignment for another run's, not for a rebatch."""
    paths = StatePaths(tmp_path)
    run, here = ("41", 1), ("rtx-1", "rtx-2")
    write_document(paths.assignment("s1-abcd"), assignment(node_list=("rtx-2", "rtx-1")))
    assert superseded_by(paths, "s1-abcd", *run, here) is None  # this run, listed in any order
    write_document(paths.assignment("s1-abcd"), assignment(node_list=()))
    assert superseded_by(paths, "s1-abcd", *run, here) is None  # no nodes named: proves nothing
    elsewhere = assignment(round_index=9, node_list=("a100-1", "a100-2"))
    write_document(paths.assignment("s1-abcd"), elsewhere)
    assert superseded_by(paths, "s1-abcd", *run) is None  # a run that does not know its nodes
    assert superseded_by(paths, "s1-abcd", *run, here) == elsewhere


def test_a_run_left_behind_exits_once_its_successor_trains(tmp_path: Path) -> None:
    """Its exit is the Slurm job's completion: sent while the requeued job still waits, Slurm
    completes the pending job with it; once the successor runs on another node, Slurm refuses
    it as coming from the wrong node. So the left-behind launcher waits for a report of the
    successor's run, for Slurm's SIGTERM, or for its time limit."""
    paths = StatePaths(tmp_path)
    paths.job_dir("s1-abcd").mkdir(parents=True)
    successor = assignment(round_index=9, slurm_restart_count=2)  # job 41 run 2
    now = [0.0]
    # The old run's last report (its round 7), then the new run's.
    reports = {3.0: ("41", 1, 7), 5.0: ("41", 2, 9)}

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] in reports:
            job_id, restarts, round_index = reports[now[0]]
            report = MetricsReport(
                "s1-abcd", now[0], "rtx", 2, 4, 6, 1, 0.5, 0.1, 1.0, 1.0, round_index=round_index,
                slurm_job_id=job_id, slurm_restart_count=restarts,
            )  # fmt: skip
            write_document(paths.metrics("s1-abcd"), report)

    def wait(terminated: bool = False, limit: float = 60.0) -> bool:
        now[0] = 0.0
        return await_successor(
            paths, successor, lambda: terminated, limit, clock=lambda: now[0], sleep=sleep
        )

    assert wait() and now[0] == 5.0  # not at the old run's report of t = 3
    paths.metrics("s1-abcd").unlink()
    assert not wait(limit=4.0) and now[0] == 4.0  # no successor report: the time limit
    assert not wait(terminated=True) and now[0] == 0.0  # Slurm's SIGTERM: at once
    # A successor with this run's own identity (on other nodes): told apart by its round.
    successor = assignment(round_index=9, node_list=("a100-1", "a100-2"))  # job 41 run 1
    reports = {3.0: ("41", 1, 7), 5.0: ("41", 1, 9)}
    assert wait() and now[0] == 5.0


# ------------------------------------------------------------------------------------------------
# Evidence and verdict


def test_the_evidence_of_a_run_is_its_own(tmp_path: Path) -> None:
    """Files of another run (an earlier restart, another job id) never count for this one,
    and a verdict written clears this run's files only."""
    assert read_evidence(tmp_path, "41", 1) == RunEvidence()
    mark_task(tmp_path, "41", 0, 0)  # the previous run
    mark_task(tmp_path, "42", 1, 0)  # another Slurm job
    write_training(tmp_path, "41", 0, TrainingRecord(90, "completed"))
    assert read_evidence(tmp_path, "41", 1) == RunEvidence()
    mark_task(tmp_path, "41", 1, 0)
    mark_task(tmp_path, "41", 1, 1)
    mark_rendezvous_failure(tmp_path, "41", 1, 0, "RendezvousConnectionError: port taken")
    write_training(tmp_path, "41", 1, TrainingRecord(12))
    evidence = read_evidence(tmp_path, "41", 1)
    assert evidence == RunEvidence(
        2, ("RendezvousConnectionError: port taken",), TrainingRecord(12)
    )
    clear_evidence(tmp_path, "41", 1)
    assert read_evidence(tmp_path, "41", 1) == RunEvidence()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "task-41.0.0", "task-42.1.0", "training-41.0.json"
    ]  # fmt: skip


def test_a_malformed_training_record_is_read_as_none(tmp_path: Path) -> None:
    for text in ('{"steps": -1, "end": null}', '{"steps": 3, "end": "won"}', "not json"):
        (tmp_path / "training-41.1.json").write_text(text)
        assert read_evidence(tmp_path, "41", 1).training is None
    (tmp_path / "training-41.1.json").unlink()
    (tmp_path / "training-41.1.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text('{"steps": 3, "end": "completed"}')
    assert read_evidence(tmp_path, "41", 1).training is None  # never followed


TASKS = RunEvidence(tasks_started=1)


@pytest.mark.parametrize(
    ("status", "evidence", "expected"),
    [
        # A command that does not use the trainer: its status is all there is.
        (0, TASKS, (0, ExitCause.COMPLETED)),
        (1, TASKS, (1, ExitCause.FAILED)),
        # The trainer completed: completed, even when a rank died at teardown.
        (0, RunEvidence(1, (), TrainingRecord(90, "completed")), (0, ExitCause.COMPLETED)),
        (134, RunEvidence(1, (), TrainingRecord(90, "completed")), (0, ExitCause.COMPLETED)),
        # The script returned by itself before the trainer's last step: its choice.
        (0, RunEvidence(1, (), TrainingRecord(40, "exited")), (0, ExitCause.COMPLETED)),
        # srun exited 0 under a trainer that was killed: a node failure (soak defect 4).
        (0, RunEvidence(1, (), TrainingRecord(33)), (EXIT_ABORTED, ExitCause.ABORTED)),
        (
            0,
            RunEvidence(1, (), TrainingRecord(33, "terminated")),
            (EXIT_ABORTED, ExitCause.ABORTED),
        ),
        (
            143,
            RunEvidence(1, (), TrainingRecord(33, "terminated")),
            (EXIT_ABORTED, ExitCause.ABORTED),
        ),
        # It stopped for a stop this run never acknowledged: not a completion.
        (0, RunEvidence(1, (), TrainingRecord(33, "stopped")), (EXIT_ABORTED, ExitCause.ABORTED)),
        # It died inside that stop (the soak killed rank 0 writing its stop checkpoint) and
        # Slurm ended nothing under it: the job's own code, not "a node failure?" (soak
        # 2026-11-26, bert-03) ...
        (1, RunEvidence(1, (), TrainingRecord(64, "stopped")), (1, ExitCause.FAILED)),
        # ... unless Slurm says it did (a node died under the stop).
        (
            1,
            RunEvidence(1, (), TrainingRecord(64, "stopped"), "node a100-1 DOWN*"),
            (EXIT_ABORTED, ExitCause.ABORTED),
        ),
        # The trainer raised (no end said) and srun failed: the job's own code.
        (1, RunEvidence(1, (), TrainingRecord(33)), (1, ExitCause.FAILED)),
        # srun started no task (soak defect 3b: "Unable to confirm allocation"): Slurm's.
        (1, RunEvidence(), (1, ExitCause.LAUNCH_FAILED)),
        # The rendezvous never formed: not the job's code.
        (1, RunEvidence(2, ("RendezvousConnectionError",)), (1, ExitCause.LAUNCH_FAILED)),
    ],
)
def test_the_verdict_tells_the_jobs_failure_from_slurms(
    status: int, evidence: RunEvidence, expected: tuple[int, ExitCause]
) -> None:
    code, cause, message = run_end(status, evidence)
    assert (code, cause) == expected
    assert message
    assert cause.users_fault == (cause is ExitCause.FAILED)


# ------------------------------------------------------------------------------------------------
# The rendezvous port


def test_the_rendezvous_port_is_free_and_never_one_the_kernel_hands_out() -> None:
    """A port the kernel hands out (bind to port 0) can be handed out again between the probe
    and torchrun's own bind: the chaos soak saw srun take it. So the port comes from below
    the ephemeral range, the search starting at the seed's position, skipping taken ports."""
    low, _ = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    held = reserve_port(7)
    assert held.port in RDZV_PORTS and held.port < low
    held.release()
    # Ports only this session uses: jobs of every session reserve ports in RDZV_PORTS.
    quiet = quiet_ports(6)
    first = reserve_port(3, quiet)
    assert first.port == quiet[3]  # starts at the seed's position
    second = reserve_port(3, quiet)
    assert second.port == quiet[4]  # reserved ports are skipped while held...
    first.release()
    again = reserve_port(3 + len(quiet), quiet)
    assert again.port == quiet[3]  # ...and free again once released (modulo the range)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        again.release()
        taken.bind(("", quiet[3]))
        taken.listen()
        third = reserve_port(3, quiet)
        assert third.port == quiet[5]  # bound by someone: skipped; quiet[4] still held
    for reservation in (second, third):
        reservation.release()
    with pytest.raises(RunError, match="ephemeral range"):
        reserve_port(0, range(low, low + 10))


def test_a_reservation_holds_across_processes_and_dies_with_its_holder() -> None:
    """Two launchers of any users on one node: the reservation is an abstract Unix socket,
    so another process sees it held, and the kernel frees it when its holder dies."""
    quiet = quiet_ports(8)[6:]
    code = (
        "import sys; from sia_slurm.job.runs import reserve_port;"
        f"r = reserve_port(0, range({quiet.start}, {quiet.stop})); print(r.port, flush=True);"
        "sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == str(quiet[0])
        mine = reserve_port(0, quiet)
        assert mine.port == quiet[1]
        mine.release()
    finally:
        holder.kill()
        holder.wait()
    mine = reserve_port(0, quiet)
    assert mine.port == quiet[0]
    mine.release()


def test_node_0s_agent_hosts_the_store_and_the_others_do_not() -> None:
    assert agent_options({"SLURM_NODEID": "0"}) == ["--rdzv-conf=is_host=true"]
    assert agent_options({"SLURM_NODEID": "3"}) == ["--rdzv-conf=is_host=false"]
    assert agent_options({}) == []  # not under srun: torchrun's own guess


@pytest.mark.parametrize(
    ("body", "end"),
    [
        ("pass", "exited"),  # the script returned by itself
        ("raise SystemExit(0)", "exited"),
        ("recorder.ended('completed')", "completed"),
        ("recorder.ended('completed'); raise RuntimeError('at teardown')", "completed"),
        ("raise RuntimeError('a bug of the job')", None),  # an unhandled exception says nothing
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", None),  # killed
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", None),
    ],
)
def test_the_trainer_says_how_its_process_ended(tmp_path: Path, body: str, end: str | None) -> None:
    """A real process: atexit runs on a return or sys.exit, not after an unhandled exception
    (which is the job's failure: srun's status says it) nor after a kill."""
    code = (
        "import sys; from pathlib import Path; from sia_slurm.job.runs import TrainingRecorder\n"
        f"recorder = TrainingRecorder(Path(sys.argv[1]), '41', 1, lambda: 33)\n{body}\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, check=False)
    assert read_evidence(tmp_path, "41", 1).training == TrainingRecord(33, end)


class ScontrolRunner:
    """``scontrol -o show job|node`` answers, or a failure when Slurm cannot be reached."""

    def __init__(self, job: str, nodes: str, fail: bool = False) -> None:
        self.answers = {"job": job, "node": nodes}
        self.fail = fail
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        self.calls.append(list(argv))
        if self.fail:
            raise CommandError(argv, 1, "slurm_load_jobs error: Unable to contact slurm controller")
        return CommandResult(tuple(argv), 0, self.answers[argv[3]], "")


RUNNING = "JobId=41 JobName=x JobState=RUNNING Reason=None Restarts=1 NodeList=t4-1"
NODE_OK = "NodeName=t4-1 Arch=x86_64 CoresPerSocket=1 State=MIXED ThreadsPerCore=1"


@pytest.mark.parametrize(
    ("job", "nodes", "said"),
    [
        (RUNNING, NODE_OK, ""),  # the run ended by itself: Slurm still runs this batch step
        (RUNNING.replace("RUNNING", "PENDING").replace("None", "BeginTime"), NODE_OK,
         "job 41 is PENDING (reason BeginTime, restarts 1)"),  # requeued after a node failure
        (RUNNING.replace("Restarts=1", "Restarts=2"), NODE_OK, "restarts 2"),
        (RUNNING, NODE_OK.replace("MIXED", "DOWN+NOT_RESPONDING"), "node t4-1 DOWN+NOT_RESPONDING"),
        (RUNNING, NODE_OK.replace("MIXED", "IDLE+DRAIN"), ""),  # drained: it still runs jobs
        # To be powered down once idle (22.05, `scontrol update State=POWER_DOWN`): runs on.
        (RUNNING, NODE_OK.replace("MIXED", "MIXED+POWER_DOWN"), ""),
        (RUNNING, NODE_OK.replace("MIXED", "IDLE+POWERED_DOWN"), "node t4-1 IDLE+POWERED_DOWN"),
        (RUNNING, NODE_OK.replace("MIXED", "DOWN*"), "node t4-1 DOWN*"),
    ],
)  # fmt: skip
def test_slurm_says_when_it_ended_a_run_under_srun(job: str, nodes: str, said: str) -> None:
    runner = ScontrolRunner(job, nodes)
    answer = slurm_ended(runner, "41", 1, "t4-1")
    assert (said in answer) if said else answer == ""
    assert runner.calls == [
        ["scontrol", "-o", "show", "job", "41"], ["scontrol", "-o", "show", "node", "t4-1"]
    ]  # fmt: skip
    assert slurm_ended(ScontrolRunner(job, nodes, fail=True), "41", 1, "t4-1") == ""


def test_a_run_slurm_ended_is_aborted_whatever_srun_says() -> None:
    """After "Node failure on N" srun exits 0 on 22.05, 1 on 24.11 and 26.05 (all seen)."""
    for status in (0, 1):
        evidence = RunEvidence(1, (), TrainingRecord(5), slurm_ended="node t4-1 DOWN")
        code, cause, message = run_end(status, evidence)
        assert (code, cause) == (EXIT_ABORTED, ExitCause.ABORTED) and "t4-1 DOWN" in message
    completed = RunEvidence(1, (), TrainingRecord(90, "completed"), slurm_ended="node t4-1 DOWN")
    assert run_end(1, completed)[1] is ExitCause.COMPLETED  # it finished before its node died
