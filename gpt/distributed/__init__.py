"""Several processes: the process group and its collectives (world.py), torchrun with the exit
status of its workers (torchrun.py), and no process outliving its parent (orphans.py)."""
