"""compare.py's parts: the readers and mode names its comparisons share (rows.py), the workloads'
comparisons with their acceptance checks (checked.py), the merges of a gpu_check.py phase's scratch
folder (merges.py) and the A/B of two builds (ab.py)."""
