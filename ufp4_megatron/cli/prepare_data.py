"""`ufp4-prepare-data` / `python -m ufp4_megatron.cli.prepare_data`: files -> Megatron indexed
data; the work (and the flags) are ufp4_megatron.data.prepare's."""

from ..data.prepare import main

if __name__ == "__main__":
    main()
