"""A TrainJob's status.trainerStatus in the step's log (components/trainjob/progress_lines.py). The
launcher's watch feeding it on the test cluster is tests/runtimes/test_train_gpt_nodes.py's."""

from __future__ import annotations

from components.trainjob.progress_lines import ProgressLines, describe


def trainjob(trainer_status: dict | None, conditions: list | None = None) -> dict:
    status = {"conditions": conditions or []}
    if trainer_status is not None:
        status["trainerStatus"] = trainer_status
    return {"metadata": {"name": "train-gpt-1a2b3c4d"}, "status": status}


def test_a_line_says_progress_time_left_and_metrics():
    obj = trainjob({"progressPercentage": 42, "estimatedRemainingSeconds": 310,
                    "lastUpdatedTime": "2026-11-28T12:00:05Z",
                    "metrics": [{"name": "loss", "value": "1.62"},
                                {"name": "val_bpb", "value": "1.95"}]})  # fmt: skip
    assert describe(obj) == ("TrainJob train-gpt-1a2b3c4d trainerStatus: 42% done, about 310 s "
                             "left | loss 1.62, val_bpb 1.95")  # fmt: skip
    assert describe(trainjob({"lastUpdatedTime": "2026-11-28T12:00:05Z"})) == (
        "TrainJob train-gpt-1a2b3c4d trainerStatus: no progress")
    assert describe(trainjob(None)) == "" and describe({"metadata": {"name": "x"}}) == ""


def test_each_change_is_said_once():
    said: list[str] = []
    lines = ProgressLines(said.append)
    first = {"progressPercentage": 12, "lastUpdatedTime": "2026-11-28T12:00:00Z"}
    lines(trainjob(None))  # created: nothing yet
    lines(trainjob(first))
    lines(trainjob(first, [{"type": "Suspended", "status": "False"}]))  # another field changed
    lines(trainjob({**first, "lastUpdatedTime": "2026-11-28T12:00:05Z"}))  # nothing new to say
    lines(trainjob({"progressPercentage": 100, "lastUpdatedTime": "2026-11-28T12:00:09Z"}))
    assert [line.split(": ", 1)[1] for line in said] == ["12% done", "100% done"]
