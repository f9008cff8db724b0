"""HiGHS's C-level prints stay off the terminal (issue 16: ``sia-slurm simulate`` showed
``HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();``)."""

from __future__ import annotations

import contextlib
import logging
import os

from sia_slurm.policy import sia_milp
from sia_slurm.policy.fd_capture import captured_fds

from .test_sia_milp import random_program

PRINTS = (56, 60, 3)  # seed, jobs, types of a program on which scipy 1.17's HiGHS prints


def test_captured_fds_takes_what_c_code_writes_to_fds_1_and_2(capfd):
    with captured_fds() as printed:
        os.write(1, b"to fd 1\n")
        os.write(2, b"to fd 2\n")
    assert printed == ["to fd 1\nto fd 2\n"]
    assert capfd.readouterr() == ("", "")
    os.write(1, b"after\n")  # and the descriptors are back where they were
    assert capfd.readouterr().out == "after\n"


def test_a_solve_that_used_to_print_prints_nothing_and_logs_it(capfd, caplog, monkeypatch):
    program = random_program(*PRINTS)
    with monkeypatch.context() as patch:  # the same solve without the capture: HiGHS prints
        patch.setattr(sia_milp, "captured_fds", lambda: contextlib.nullcontext([""]))
        sia_milp.highs(program, 10.0, 1e-4)
    assert "HighsMipSolverData" in "".join(capfd.readouterr())
    with caplog.at_level(logging.DEBUG, logger="sia_slurm.policy.sia_milp"):
        result = sia_milp.highs(program, 10.0, 1e-4)
    assert result.status == "optimal"
    assert capfd.readouterr() == ("", "")
    assert "HighsMipSolverData" in caplog.text
