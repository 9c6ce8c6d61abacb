"""The finish: what a session measured (measured.py) turned into the Run every door writes
(assemble.py, with record.py, figures.py, costs.py, memory.py; write.py saves a user-code run)."""
