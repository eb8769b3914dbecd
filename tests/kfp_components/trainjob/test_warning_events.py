"""components/trainjob/warning_events.py: a TrainJob's Warning Events from the core API and
from the test cluster's folder, in the shape Kubeflow Trainer v2.3 writes them
(events.k8s.io/v1); and the pods list (components/trainjob/podlogs.py) that says why a pod
waits, or that it may not be read."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.cluster.events import EventRecorder

from components.trainjob import warning_events as events
from components.trainjob.podlogs import INDEX_LABEL, CoreV1PodLogs
from components.trainjob.warning_events import CoreV1Events, LogDirEvents, MissingPermission

TRAINJOB = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "train-gpt-0a1b2c3d", "namespace": "ns", "uid": "u-1",
                 "resourceVersion": "7"},
}  # fmt: skip


def test_the_folder_gives_the_newest_warning_of_that_object_with_its_series_count(tmp_path):
    recorder = EventRecorder(tmp_path, "trainer-trainjob-controller")
    for _ in range(5):  # requeued: a series of two on the server, the rest in memory
        recorder.eventf(TRAINJOB, "Warning", "TrainJobResourcesCreationFailed", "Reconciling", "x")
    recorder.eventf(TRAINJOB, "Normal", "Created", "Reconciling", "not a warning")
    # An older TrainJob of the same name (another uid) is not this one.
    recorder.eventf({**TRAINJOB, "metadata": {**TRAINJOB["metadata"], "uid": "u-0"}},
                    "Warning", "Old", "Reconciling", "of the old one")  # fmt: skip
    recorder.eventf(TRAINJOB, "Warning", "Newest", "Reconciling", "last")
    found = LogDirEvents(tmp_path).warnings("ns", "TrainJob", "train-gpt-0a1b2c3d", "u-1")
    assert [str(e) for e in found] == [
        "TrainJobResourcesCreationFailed: x (x2)",
        "Newest: last",
    ]
    assert LogDirEvents(tmp_path).warnings("other", "TrainJob", "train-gpt-0a1b2c3d", "u-1") == []


def test_the_folder_holds_core_v1_events_as_trainer_writes_them(tmp_path):
    recorder = EventRecorder(tmp_path, "trainer-trainjob-controller")
    recorder.eventf(TRAINJOB, "Warning", "R", "Reconciling", "m")
    (path,) = (tmp_path / "ns" / ".events").glob("*.json")
    event = json.loads(path.read_text())
    assert path.stem.startswith("train-gpt-0a1b2c3d.")
    assert event["involvedObject"]["uid"] == "u-1" and event["message"] == "m"
    # events.k8s.io/v1 seen through core/v1: no deprecated count / lastTimestamp, an eventTime.
    assert "count" not in event and "lastTimestamp" not in event
    assert event["reportingComponent"] == "trainer-trainjob-controller"
    assert event["eventTime"].endswith("Z") and "." in event["eventTime"]


class FakeCoreV1:
    """`CoreV1Api` with one answer to `list_namespaced_event`; it notes what it was asked."""

    def __init__(self, answer):
        self.answer, self.asked = answer, None
        self.api_client = client.ApiClient()

    def list_namespaced_event(self, namespace, field_selector):
        self.asked = (namespace, field_selector)
        if isinstance(self.answer, Exception):
            raise self.answer
        return client.CoreV1EventList(items=self.answer)


def core_event(reason: str, began: datetime, series=None) -> client.CoreV1Event:
    """An events.k8s.io/v1 Event as `GET /api/v1/.../events` returns it."""
    return client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=f"j.{reason}"),
        involved_object=client.V1ObjectReference(kind="TrainJob", name="j", uid="u"),
        type="Warning", reason=reason, message=f"{reason} happened", action="Reconciling",
        event_time=began, series=series,
    )  # fmt: skip


def test_the_core_api_is_asked_for_that_objects_warnings_and_ordered_by_last_seen(monkeypatch):
    at = lambda second, micro=0: datetime(2026, 1, 1, 0, 0, second, micro, tzinfo=UTC)  # noqa: E731
    repeated = client.CoreV1EventSeries(count=2, last_observed_time=at(5))
    fake = FakeCoreV1([core_event("Repeated", at(0), repeated), core_event("Once", at(3, 500))])
    monkeypatch.setattr(client, "CoreV1Api", lambda: fake)
    found = CoreV1Events().warnings("ns", "TrainJob", "j", "u")
    assert fake.asked == (
        "ns", "involvedObject.kind=TrainJob,involvedObject.name=j,involvedObject.uid=u,type=Warning"
    )  # fmt: skip
    # The series was last seen after the single one, though it began before.
    assert [str(e) for e in found] == ["Once: Once happened", "Repeated: Repeated happened (x2)"]


def test_a_403_is_a_missing_permission_not_an_empty_answer(monkeypatch):
    monkeypatch.setattr(client, "CoreV1Api", lambda: FakeCoreV1(ApiException(status=403)))
    with pytest.raises(MissingPermission, match="may not list events in namespace ns"):
        CoreV1Events().warnings("ns", "TrainJob", "j", "u")


def test_the_source_is_the_folder_where_pod_logs_are(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT_POD_LOG_DIR", str(tmp_path))
    assert isinstance(events.from_environment(), LogDirEvents)
    monkeypatch.delenv("GPT_POD_LOG_DIR")
    assert isinstance(events.from_environment(), CoreV1Events)


# ---- pods: components/trainjob/podlogs.py's CoreV1PodLogs, from the one pods list ------


class FakePodsApi:
    """`CoreV1Api` with one answer to `list_namespaced_pod`."""

    def __init__(self, answer):
        self.answer = answer
        self.api_client = client.ApiClient()

    def list_namespaced_pod(self, namespace, label_selector):
        if isinstance(self.answer, Exception):
            raise self.answer
        return client.V1PodList(items=self.answer)


def test_a_403_listing_pods_is_a_missing_permission_not_no_pods(monkeypatch):
    monkeypatch.setattr(client, "CoreV1Api", lambda: FakePodsApi(ApiException(status=403)))
    with pytest.raises(MissingPermission, match="may not list pods in namespace ns"):
        CoreV1PodLogs().refs("ns", "j")
    # A server without the core group (the test API server) has no pods to list.
    monkeypatch.setattr(client, "CoreV1Api", lambda: FakePodsApi(ApiException(status=404)))
    assert CoreV1PodLogs().refs("ns", "j") == []


def test_the_pods_list_says_why_each_pod_waits(monkeypatch):
    def pod(name, status):
        return client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, uid=f"u-{name}", labels={
                "jobset.sigs.k8s.io/jobset-name": "j", INDEX_LABEL: name[-1]},
                creation_timestamp=datetime(2026, 1, 1, tzinfo=UTC)), status=status)  # fmt: skip

    pulling = client.V1PodStatus(phase="Pending", container_statuses=[client.V1ContainerStatus(
        name="node", image="x:typo", image_id="", ready=False, restart_count=0,
        state=client.V1ContainerState(waiting=client.V1ContainerStateWaiting(
            reason="ImagePullBackOff", message='Back-off pulling image "x:typo"')))])  # fmt: skip
    unscheduled = client.V1PodStatus(phase="Pending", conditions=[client.V1PodCondition(
        type="PodScheduled", status="False", reason="Unschedulable",
        message="0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")])  # fmt: skip
    monkeypatch.setattr(client, "CoreV1Api", lambda: FakePodsApi(
        [pod("j-node-0-1", unscheduled), pod("j-node-0-0", pulling)]))  # fmt: skip
    node0, node1 = CoreV1PodLogs().refs("ns", "j")
    assert (node0.name, node0.uid, node0.phase) == ("j-node-0-0", "u-j-node-0-0", "Pending")
    assert node0.waiting == 'ImagePullBackOff: Back-off pulling image "x:typo"'
    assert node1.waiting == "Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    assert node0.created == datetime(2026, 1, 1, tzinfo=UTC).timestamp()
