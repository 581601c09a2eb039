"""What each command does to a run: `cli/X.py` parses, `jobs/X.py` runs. Every job starts from
the one preparation in prepare.py."""
