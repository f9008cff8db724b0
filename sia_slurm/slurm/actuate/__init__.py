"""Actuating Slurm: carrying out a round's actions, and enforcing the controller's grants.

:mod:`.actuator` orders the steps of Stop, Move, Start and Rebatch (:mod:`.waits` how long it
waits inside a stop, :mod:`.rebatch`, :mod:`.resubmit` and :mod:`.timelimit` single steps);
:mod:`.enforce` undoes what the controller did not grant before it acts; :mod:`.calls` runs
the commands with the failure handling each step needs. Apart from the observing side
(:mod:`sia_slurm.slurm.observe`), whose view of the jobs it reads, so that observing never
depends on actuating and neither on the backend (:mod:`sia_slurm.slurm.backend`) that composes
them. Importing this package imports none of its modules.
"""
