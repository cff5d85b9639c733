"""``python -m ops.drills DRILL [flags]``: run one drill (``DRILL --help`` shows its flags)."""

import sys

from ops.commands import dispatch

DRILLS = {
    "reload": ("ops.drills.reload", "hot reload under load: versions pushed while clients run"),
    "fault": ("ops.drills.fault", "the model server SIGKILLed and restarted, then made slow"),
    "replica": ("ops.drills.replica", "replicas behind one gateway: kill one, push, promote"),
    "rolling": ("ops.drills.rolling", "rolling update, a slow replica, a hung one, rollback"),
    "rollout": ("ops.drills.rollout", "a good version rolled out and a bad one back, real tickets"),
    "migration": ("ops.drills.migration", "an embedder migrated to another space under load"),
    "hostile": ("ops.drills.hostile", "hostile clients beside well-behaved ones; restarts"),
    "costly": ("ops.drills.costly", "each costly request alone: status, time, worker peak RSS"),
}

if __name__ == "__main__":
    raise SystemExit(dispatch("ops.drills", DRILLS, sys.argv[1:]))
