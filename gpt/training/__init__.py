"""What train-gpt does around the model: the trainer (trainer.py), checkpoints (checkpoint.py) and
the resume rule (resume_rule.py), stopping at a checkpoint on SIGTERM (stopping.py), the weight
average (ema.py), the divergence guard (divergence.py), the report (report.py), and the faults the
crash-safety tests inject (faults.py)."""
