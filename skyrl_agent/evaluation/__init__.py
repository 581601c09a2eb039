"""Offline evaluation of stored runs: statistics, re-grading, comparison, HTML reports."""
