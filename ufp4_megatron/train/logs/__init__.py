"""What a run says and records: the console step line and messages (log_line), the metrics file
every step appends to (metrics), TensorBoard and W&B (tensorboard_log, wandb_run), and the
filter that keeps Megatron's import-time noise off the console (quiet)."""
