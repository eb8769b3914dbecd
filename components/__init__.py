"""KFP components: one per stage, each creating a Kubeflow Trainer TrainJob (or a local process)."""
