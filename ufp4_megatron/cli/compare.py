"""`ufp4-compare` / `python -m ufp4_megatron.cli.compare`: the loss-gap report of
ufp4_megatron.report.compare, which the Hydra callback and `ufp4-launch compare` also run."""

import sys

from ..report.compare import main

if __name__ == "__main__":
    sys.exit(main())
