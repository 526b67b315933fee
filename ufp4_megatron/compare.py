"""`python -m ufp4_megatron.compare`: an alias of ufp4_megatron.report.compare."""
from .report.compare import main

if __name__ == "__main__":
    main()
