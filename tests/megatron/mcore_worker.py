"""One gloo rank of a scenario: `python mcore_worker.py <scenario> <out_dir> <json kwargs>`."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ufp4_megatron.megatron import enable_cpu_compat


def main() -> None:
    name, out_dir, kwargs = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    torch.set_num_threads(1)
    enable_cpu_compat()
    dist.init_process_group("gloo")
    import mcore_scenarios

    results = getattr(mcore_scenarios, name)(**kwargs)
    if dist.get_rank() == 0:
        torch.save(results, out_dir / f"{name}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
