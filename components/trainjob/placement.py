"""Where and how long a stage runs: one validated value, from the component to the backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Placement:
    """A stage's nodes, processes, GPUs and deadline; refused on construction (ValueError naming
    the parameter) before anything is created."""

    num_nodes: int = 1
    """Nodes (TrainJob numNodes); the local backend has one."""
    num_proc_per_node: int = 0
    """Processes per node (TrainJob numProcPerNode; torchrun when > 1); 0: one per GPU
    (gpus_per_node), else 1."""
    gpus_per_node: int = 0
    """NVIDIA GPUs to request per node (TrainJob resourcesPerNode); 0: the runtime's resources."""
    timeout: float = 3600
    """Seconds before the stage is stopped (its TrainJob deleted) and the step fails (the
    prompt's: keep it above idle_timeout)."""
    start_timeout: float = 120
    """Seconds a TrainJob may go without a pod, and each of its pods may stay Pending
    (unschedulable, its image not pulled, its volume not attached), before the TrainJob is
    deleted and the step fails with the reason; raise it where pulling the image takes longer."""

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes {self.num_nodes}: must be at least 1")
        if self.gpus_per_node < 0:
            raise ValueError(f"gpus_per_node {self.gpus_per_node}: must be >= 0")
        if self.num_proc_per_node < 0:
            raise ValueError(f"num_proc_per_node {self.num_proc_per_node}: must be >= 0")
        if self.num_proc_per_node == 0:
            object.__setattr__(self, "num_proc_per_node", self.gpus_per_node or 1)
        if self.gpus_per_node and self.num_proc_per_node > self.gpus_per_node:
            # NCCL refuses two ranks on one GPU ("Duplicate GPU detected").
            raise ValueError(
                f"num_proc_per_node {self.num_proc_per_node}: more processes than the "
                f"{self.gpus_per_node} GPU(s) per node; run one process per GPU (0 does)"
            )
        if not self.timeout > 0:
            raise ValueError(f"timeout {self.timeout}: must be a positive number of seconds")
        if not self.start_timeout > 0:
            raise ValueError(
                f"start_timeout {self.start_timeout}: must be a positive number of seconds"
            )

    @property
    def single_process(self) -> bool:
        return (self.num_nodes, self.num_proc_per_node) == (1, 1)

    @property
    def resources_per_node(self) -> dict[str, Any] | None:
        """TrainJob resourcesPerNode (ResourceRequirements), or None: the runtime's."""
        return {"limits": {"nvidia.com/gpu": self.gpus_per_node}} if self.gpus_per_node else None
