"""A rank that joins the run, starts a child, says READY with both pids, and sleeps."""

import os
import subprocess
import sys
import time

import jaxcore

jaxcore.initialize()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print("READY", os.getpid(), child.pid, flush=True)
time.sleep(120)
