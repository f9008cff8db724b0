"""Everything that talks to Slurm: the command runner, output parsers, the dev cluster.

:mod:`.observe` builds a snapshot, :mod:`.actuate` carries out a round's actions, and
:mod:`.backend` (``SlurmBackend``) composes the two; the plumbing both use stays here: the
command runner (:mod:`.runner`), the parser of ``scontrol -o`` records (:mod:`.records`, which
the job side uses too), the command lines (:mod:`.commands`) and Slurm's own settings
(:mod:`.slurm_conf`).
"""
