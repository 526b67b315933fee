import os

# W&B never reaches the network from tests; runs that log go offline into temp dirs.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
