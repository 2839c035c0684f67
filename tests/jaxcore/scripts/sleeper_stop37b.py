"""A rank that starts a child, says READY with both pids, and sleeps (or exits with argv[1])."""

import subprocess
import sys
import time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("READY", child.pid, flush=True)
if len(sys.argv) > 1:
    sys.exit(int(sys.argv[1]))
time.sleep(60)
