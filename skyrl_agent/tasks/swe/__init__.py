"""SWE-bench-format instances as Harbor tasks (see source.py); swebench does the grading."""
