"""Helper for the launcher's preemption tests (no JAX, so it starts fast).

preempt_rank.py D             write D/pid<rank>; on SIGTERM exit 75 (a rank that saved)
preempt_rank.py D --stubborn  rank 1 ignores SIGTERM (a save that never ends)
"""

import os
import signal
import sys
import time
from pathlib import Path

rank = int(os.environ["JAXCORE_PROCESS_ID"])
stubborn = "--stubborn" in sys.argv and rank == 1


def on_sigterm(signum, frame):
    if stubborn:
        print(f"rank {rank} ignores SIGTERM", flush=True)
        return
    print(f"rank {rank} saved", flush=True)
    sys.exit(75)


signal.signal(signal.SIGTERM, on_sigterm)
Path(sys.argv[1], f"pid{rank}").write_text(str(os.getpid()))
for _ in range(1200):
    time.sleep(0.1)
