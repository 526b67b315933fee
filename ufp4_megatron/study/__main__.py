"""`python -m ufp4_megatron.study ...`: the same as `ufp4-launch study ...`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
