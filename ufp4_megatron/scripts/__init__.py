"""The launch scripts, shipped as package data so that an installed wheel can submit jobs.

`torchrun.sh` (torchrun on one node, or on every node with c10d rendezvous) and
`slurm.sbatch` (one torchrun.sh per node under Slurm). A checkout's `launch/torchrun.sh` and
`launch/slurm.sbatch` are links to these files, so the README's commands keep working there.
"""

from pathlib import Path

SCRIPTS_DIR = Path(__file__).resolve().parent
TORCHRUN = SCRIPTS_DIR / "torchrun.sh"
SLURM_SBATCH = SCRIPTS_DIR / "slurm.sbatch"
