"""The session's dev cluster with accounting (fixture ``accounting_cluster``, tests/conftest.py)."""

# One dev cluster with accounting (slurmdbd on MariaDB) per session, shared by
# tests/slurm/test_accounting_live.py and tests/e2e/test_accounting_controller_live.py: its
# MariaDB, slurmdbd and associations take seconds to set up, and every test there submits under
# its own ids. Ports base+40..+48: apart from the session cluster (base..) and the second (+500).
ACCOUNTING_PORT_OFFSET = 40
ACCOUNTING_CLUSTER = "a100:2x4,t4:1x4"
ACCOUNTING_SPEC = """\
accounts:
  physics: {fairshare: 2}
  biology: {fairshare: 1, gpus: 4}
users:
  root: {accounts: [physics, biology]}
qos:
  short: {gpus_per_user: 6, gpus_per_job: {a100: 2}}
"""
