"""What train-gpt does around the model: the loop (trainer.py) and what it calls, what every
unset flag becomes (recipe.py), the optimizer and its schedule (optimizer.py), compile, DDP and
bfloat16 (compute.py), the batches from the token files (batches.py), evaluation
(evaluation.py), what a checkpoint holds (checkpointer.py) and its files (checkpoint_files.py),
the progress line and records (metrics.py), stopping at a checkpoint on SIGTERM (stopping.py),
the weight average (ema.py), the divergence guard (divergence.py), the report (report.py), and
the faults the crash-safety tests inject (faults.py)."""
