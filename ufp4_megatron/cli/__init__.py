"""The command-line entry points: argument parsing and process launching, nothing below imports
them. Each module runs as `python -m ufp4_megatron.cli.<name>` and as its console script.

    launch.py        ufp4-launch: one run or a sweep through torchrun / Slurm; `study`, `compare`
    demo.py          make demo: the CPU study (bf16, e2m1, ufp4) and its report
    describe.py      ufp4-describe: parameters and memory of a config, without building it
    compare.py       ufp4-compare: loss gaps over runs and seeds (report/compare.py)
    prepare_data.py  ufp4-prepare-data: files -> Megatron indexed data (data/prepare.py)

The trainer's own entry point stays `python -m ufp4_megatron.train` (ufp4-train): torchrun,
the Slurm script and Megatron-LM's docs start that module, and it sits beside its Hydra schema.
The study (`python -m ufp4_megatron.study`) and the benchmarks (`python -m ufp4_megatron.bench`)
are packages of their own, one layer below this one; `ufp4-diagnostics` is the `main` of
diagnostics.py, whose argument parsing is the whole of its command and needs nothing above it.
"""
