"""Observing Slurm: what builds a snapshot, and nothing that changes Slurm.

A round's snapshot takes three Slurm commands whatever the cluster size (``scontrol -d -o show
node``, ``scontrol -o show reservation``, ``squeue --json``), parsed here (:mod:`.inventory`,
:mod:`.jsonparse`, :mod:`.hostlist`), plus the job files under ``state_dir``
(:mod:`.jobfiles`), the managed jobs resolved per sia id (:mod:`.managed`, :mod:`.jobs_view`),
the GPUs each node can give the policy (:mod:`.capacity`) and, every few minutes, Slurm
accounting (:mod:`.sacct`). Apart from the actuating side
(:mod:`sia_slurm.slurm.actuate`), which reads what is here but is never read from here: the
backend (:mod:`sia_slurm.slurm.backend`) composes the two. Importing this package imports none
of its modules.
"""
