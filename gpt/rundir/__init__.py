"""The run directory <root>/<run>/: its layout, the contract between the stages (layout.py), one
writer per run (runlock.py), and writes that are whole or absent (atomic.py)."""
