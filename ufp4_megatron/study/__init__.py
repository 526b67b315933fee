"""The study runner: a grid of recipes x axes x seeds, packed on one machine's GPUs (or CPUs),
every run checkpointing and resumable, then the loss-gap comparison over all of it.

    grid.py      the grid YAML (configs/study/*.yaml) and its expansion into runs
    resolve.py   each run composed as the trainer will compose it (errors before anything runs)
    manifest.py  <study>/study.json: runs, overrides, status; completion read from disk
    packing.py   slots of (GPU, CPU share); one pinned trainer process per run
    runner.py    the loop: start, watch, stop, resume; progress view; time limit
    cli.py       `ufp4-launch study` / `python -m ufp4_megatron.study`, and compare
"""
