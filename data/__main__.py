"""``python -m data``."""

import sys

from data.cli import main

sys.exit(main())
