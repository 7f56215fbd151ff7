"""serving/manager.py: the newest version on disk that loads is served, also when the
served one is removed. Removing it rolls back to the newest one left (the status, the
served-version metric and version-specific requests follow, and no request fails during
the swap); with no version left that loads, nothing is claimed: requests get NOT_FOUND,
readiness fails and the status lists the removed version as END, until a version loads."""

import os
import shutil
import types
import urllib.request

import pytest
from serving_helpers import _histories, _http, _predict_in_threads, _wait_for

from tfrs_logq.serving.client import make_request, predict_stub
from tfrs_logq.serving.metrics import PATH
from tfrs_logq.serving.server import ModelServer, ServerOptions

prometheus_parser = pytest.importorskip("prometheus_client.parser")


def _served_metric(server):
    """``tfrs_logq_served_version``'s value, or None where the metric has no sample."""
    url = f"http://127.0.0.1:{server.rest_port}{PATH}"
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    values = [s.value for family in prometheus_parser.text_string_to_metric_families(text)
              for s in family.samples if s.name == "tfrs_logq_served_version"]
    assert len(values) <= 1, values
    return values[0] if values else None


def _states(server, name):
    """``{version: (state, error_code)}`` of ``GET /v1/models/NAME``, or the error code."""
    code, body = _http(server, "GET", f"/v1/models/{name}")
    if code != 200:
        return code
    return {int(s["version"]): (s["state"], s["status"]["error_code"])
            for s in body["model_version_status"]}


def _grpc_version(server, name, version=None):
    stub, channel = predict_stub(f"127.0.0.1:{server.port}")
    request = make_request(name, _histories())
    if version is not None:
        request.model_spec.version.value = version
    try:
        return stub.Predict(request, timeout=30).model_spec.version.value
    finally:
        channel.close()


def _predict(server, name, version=None):
    at = "" if version is None else f"/versions/{version}"
    return _http(server, "POST", f"/v1/models/{name}{at}:predict",
                 {"instances": _histories().tolist()})


def test_removing_the_served_version_rolls_back_and_none_left_is_not_claimed(
        tiny_export, tmp_path):
    base = tmp_path / "base"
    for version in (1, 2):
        shutil.copytree(os.path.dirname(tiny_export) + "/1", base / str(version))
    options = ServerOptions(model_name="r", port=0, rest_api_port=0, model_base_path=str(base),
                            file_system_poll_wait_seconds=0.05)
    srv = ModelServer(options).start()
    try:
        assert _states(srv, "r") == {2: ("AVAILABLE", "OK")}
        assert _served_metric(srv) == 2
        # Removed under load: rolled back to 1, and every request is answered.
        results: list = []
        threads = _predict_in_threads(srv.rest_port, srv.port, "r", 8, results)
        shutil.rmtree(base / "2")
        _wait_for(lambda: _states(srv, "r") == {1: ("AVAILABLE", "OK")},
                  what="version 1 served alone")
        for t in threads:
            t.join(timeout=60)
        assert sorted(results) == [("grpc", "OK", 3)] * 8 + [("rest", 200, 10)] * 8, results
        assert _served_metric(srv) == 1
        assert _grpc_version(srv, "r") == 1 and _grpc_version(srv, "r", 1) == 1
        assert _predict(srv, "r", 1)[0] == 200
        assert _predict(srv, "r", 2)[0] == 404
        assert _http(srv, "GET", "/v1/models/r/versions/2")[0] == 404
        assert _http(srv, "GET", "/v1/models/r/metadata")[1]["model_spec"]["version"] == "1"
        assert _http(srv, "GET", "/readyz")[0] == 200

        # No version left: nothing is served, and the status says which one went.
        shutil.rmtree(base / "1")
        _wait_for(lambda: _states(srv, "r") == {1: ("END", "NOT_FOUND")},
                  what="version 1 reported removed")
        code, body = _predict(srv, "r")
        assert code == 404 and body["error"], body
        assert _predict(srv, "r", 1)[0] == 404
        assert _served_metric(srv) is None
        assert _http(srv, "GET", "/readyz")[0] == 503
        assert _http(srv, "GET", "/v2/models/r/ready")[0] in (404, 503)

        # A version written again is served; the removed one is no longer reported.
        shutil.copytree(os.path.dirname(tiny_export) + "/1", base / "3")
        _wait_for(lambda: _states(srv, "r") == {3: ("AVAILABLE", "OK")},
                  what="version 3 served")
        assert _served_metric(srv) == 3 and _grpc_version(srv, "r") == 3
        assert _http(srv, "GET", "/readyz")[0] == 200
    finally:
        srv.stop()


class _Loaded:
    def __init__(self, path, version, options):
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            if f.read() != b"ok":
                raise ValueError(f"version {version} is broken")
        self.version, self.closed = version, False

    def close(self):
        self.closed = True


def _manager(base):
    from tfrs_logq.serving.manager import ModelManager

    options = types.SimpleNamespace(model_name="m", model_base_path=str(base),
                                    file_system_poll_wait_seconds=3600)
    return ModelManager(options, load=_Loaded)


def _version(base, version, content=b"ok"):
    os.makedirs(base / str(version))
    (base / str(version) / "saved_model.pb").write_bytes(content)


def test_removing_the_served_version_skips_broken_ones_and_unloads_where_none_loads(tmp_path):
    from tfrs_logq.serving.errors import ServingError

    base = tmp_path / "base"
    _version(base, 1)
    _version(base, 2, b"broken")
    _version(base, 3)
    _version(base, 4, b"broken")
    manager = _manager(base)
    try:
        assert manager.current().version == 3
        shutil.rmtree(base / "3")
        manager.poll()
        assert manager.current().version == 1  # 4 and 2 do not load
        assert manager.get("m", 1).version == 1 and manager.ready()
        shutil.rmtree(base / "1")
        manager.poll()
        assert manager.current() is None and not manager.ready()
        with pytest.raises(ServingError) as raised:
            manager.get("m")
        assert raised.value.code == "NOT_FOUND"
        states = {s.version: (s.state, s.error_code) for s in manager.status("m")}
        assert states[1] == ("END", "NOT_FOUND")
        assert states[2][0] == states[4][0] == "END" and states[2][1] != "OK"
        assert all(state == "END" for state, _ in states.values())
        # The base path removed with its versions: none claimed either.
        shutil.rmtree(base)
        manager.poll()
        assert manager.current() is None
        assert {s.version: s.state for s in manager.status("m")} == {1: "END"}
    finally:
        manager.stop()


def test_the_base_path_removed_unloads_the_served_version(tmp_path):
    base = tmp_path / "base"
    _version(base, 5)
    manager = _manager(base)
    try:
        assert manager.current().version == 5
        shutil.rmtree(base)
        manager.poll()
        assert manager.current() is None
        assert [(s.version, s.state) for s in manager.status("m")] == [(5, "END")]
    finally:
        manager.stop()


def test_a_base_path_that_cannot_be_listed_keeps_the_served_version(tmp_path, monkeypatch):
    from tfrs_logq.serving import manager as manager_module

    base = tmp_path / "base"
    _version(base, 5)
    manager = _manager(base)
    try:
        listdir = os.listdir

        def unreadable(path):
            if os.fspath(path) == str(base):
                raise PermissionError(13, "Permission denied", str(path))
            return listdir(path)

        monkeypatch.setattr(manager_module.os, "listdir", unreadable)
        manager.poll()
        assert manager.current().version == 5 and manager.ready()
    finally:
        monkeypatch.undo()
        manager.stop()
