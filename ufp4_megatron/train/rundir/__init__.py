"""A run dir's identity and who may write it: what a start reads before anything is written.

identity.py      the run's identity hash (run_id, sibling_key) and its Hydra resolver
names.py         names that become paths: checked to stay under runs/
run_lock.py      rank 0's exclusive lock on the run dir and the checkpoint dir
resume_check.py  fresh start, resume, or refusal, from what is on disk
"""
