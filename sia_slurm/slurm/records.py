"""Slurm's one-line records: ``scontrol -o show ...`` output as ``{key: value}`` dicts.

``scontrol -o show node|partition|job|reservation`` prints one record per line as
``Key=Value`` pairs on every Slurm version sia-slurm supports. Beside the command runner, as
plumbing: the backend's observers (:mod:`.observe.inventory`, :mod:`.observe.jsonparse`) and
the job side (did Slurm end this run, ``sia_slurm/job/runs.py``) read them alike. A pure
function, tested against output captured from real daemons.
"""

from __future__ import annotations

import re

# A key starts a new field where a space is followed by `Name=`; values may hold spaces
# (OS=Linux 6.1 #1 SMP, Reason=...), so split on key starts, not on whitespace. Job records
# (22.05 to 26.05 alike) have keys with ':' and '/' (AllocNode:Sid=, CPUs/Task=, ReqB:S:C:T=):
# without them in the key pattern, Partition= swallowed "a100 AllocNode:Sid=0.0.0.0:25238".
_FIELD_START = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_:/]*)=")


def parse_records(text: str) -> list[dict[str, str]]:
    """Split ``scontrol -o show ...`` output into one ``{key: value}`` dict per line."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if not line or (line.startswith("No ") and "in the system" in line):
            continue
        matches = list(_FIELD_START.finditer(line))
        record = {}
        for index, match in enumerate(matches):
            end = matches[index + 1].start() if index + 1 < len(matches) else len(line)
            record[match.group(1)] = line[match.end() : end].strip()
        if record:
            records.append(record)
    return records
