"""`python -m ufp4_megatron.compare`: an alias of ufp4_megatron.report.compare (`ufp4-compare`)."""
import sys

from .report.compare import main

if __name__ == "__main__":
    sys.exit(main())
