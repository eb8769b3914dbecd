"""The test API server itself (tests/support/apiserver.py): its ports stay clear of the ones the
kernel gives connections, and it starts on others when one it picked is taken before it binds it,
as happens with several test sessions on one machine."""

from __future__ import annotations

import socket

import pytest
from support import apiserver


def test_its_ports_are_outside_the_ephemeral_range() -> None:
    ephemeral = apiserver._ephemeral_ports()
    for _ in range(50):
        port = apiserver._free_pair()
        assert port not in ephemeral and port + 1 not in ephemeral


@pytest.mark.apiserver
def test_a_port_taken_before_the_server_binds_it_is_replaced(shared, tmp_path, monkeypatch):
    if reason := apiserver.available(shared):
        pytest.skip(reason)
    with socket.socket() as taken:  # bound, not listening: binding it again fails
        taken.bind(("127.0.0.1", apiserver._free_port()))
        busy = taken.getsockname()[1]
        picks = iter([busy])
        free_port = apiserver._free_port
        monkeypatch.setattr(apiserver, "_free_port", lambda: next(picks, None) or free_port())
        with apiserver.running(shared, tmp_path / "server") as server:
            assert not server.url.endswith(f":{busy}")
            from kubernetes import client

            crds = client.ApiextensionsV1Api(server.client()).list_custom_resource_definition()
            assert any(c.spec.group == "trainer.kubeflow.org" for c in crds.items)
