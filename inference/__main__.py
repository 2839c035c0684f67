"""``python -m inference --model PATH`` (the same as ``jaxcore serve``)."""

import sys

from inference.server import main

if __name__ == "__main__":
    sys.exit(main())
