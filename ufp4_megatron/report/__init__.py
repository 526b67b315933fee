"""Reports over training runs: BF16-relative loss gaps, tables, plots, W&B summaries."""
