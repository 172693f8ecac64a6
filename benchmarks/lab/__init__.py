"""The pieces of benchmarks/gpu_check.py and benchmarks/compare.py, one small module each: the
driver's options (options.py), what its phases share (check.py), one module per phase or family of
related phases (phase_*.py), and compare.py's readers, checks, merges and A/B (compare/)."""
