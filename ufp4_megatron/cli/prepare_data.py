"""`python -m ufp4_megatron.prepare_data`: an alias of ufp4_megatron.data.prepare."""
from .data.prepare import main

if __name__ == "__main__":
    main()
