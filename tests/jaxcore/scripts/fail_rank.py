"""Helper for the launch tests (no JAX, so it starts fast).

fail_rank.py            rank 1 fails at once with code 3; the others wait
fail_rank.py --sleep D  every rank writes D/pid<rank> and waits
"""

import os
import sys
import time
from pathlib import Path

rank = int(os.environ["JAXCORE_PROCESS_ID"])
print(f"started rank {rank} of {os.environ['JAXCORE_NUM_PROCESSES']}", flush=True)
if sys.argv[1:2] == ["--sleep"]:
    Path(sys.argv[2], f"pid{rank}").write_text(str(os.getpid()))
elif rank == 1:
    print("boom: rank 1 cannot go on", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(120)
