"""serving/manager.py: a corrupt version is logged once, shown in the status, and the
good one serves."""

import logging
import os

from serving_helpers import _histories, _http, _wait_for
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
)

from tfrs_logq.serving.client import make_request, predict_stub
from tfrs_logq.serving.server import ModelServer, ServerOptions


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_corrupt_version_is_logged_once_shown_in_the_status_and_the_good_one_serves(
        exports, tmp_path, monkeypatch):
    import shutil

    from tfrs_logq.serving.manager import ModelManager

    polls = []  # the manager's polls of the base path, counted
    poll = ModelManager.poll
    monkeypatch.setattr(ModelManager, "poll", lambda self: (polls.append(1), poll(self))[1])

    base = tmp_path / "base"
    shutil.copytree(exports["paths"]["brute-force"], base / "1")
    shutil.copytree(exports["paths"]["brute-force"], base / "2")
    (base / "2" / "saved_model.pb").write_bytes(os.urandom(2000))  # corrupt
    records = _Records()
    logger = logging.getLogger("tfrs_logq.serving")
    logger.addHandler(records)
    level = logger.level
    logger.setLevel(logging.INFO)
    options = ServerOptions(model_name="c", port=0, rest_api_port=0, model_base_path=str(base),
                            file_system_poll_wait_seconds=0.05)
    srv = ModelServer(options).start()
    try:
        _wait_for(lambda: len(polls) >= 20, what="20 polls")
        failures = [m for m in records.messages if "could not load version 2" in m]
        assert len(failures) == 1, records.messages
        stub, channel = predict_stub(f"127.0.0.1:{srv.port}")
        assert stub.Predict(make_request("c", _histories()), timeout=30) \
            .model_spec.version.value == 1
        code, body = _http(srv, "GET", "/v1/models/c")
        assert code == 200
        statuses = {s["version"]: s for s in body["model_version_status"]}
        assert statuses["1"]["state"] == "AVAILABLE"
        assert statuses["1"]["status"]["error_code"] == "OK"
        assert statuses["2"]["state"] == "END"
        assert statuses["2"]["status"]["error_code"] != "OK"
        assert statuses["2"]["status"]["error_message"]
        assert _http(srv, "GET", "/v1/models/c/versions/2")[1]["model_version_status"] == \
            [statuses["2"]]
        grpc_status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "c"}), timeout=30)
        by_version = {s.version: s for s in grpc_status.model_version_status}
        assert by_version[1].state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
        assert by_version[2].state == get_model_status_pb2.ModelVersionStatus.END
        assert by_version[2].status.error_code != 0 and by_version[2].status.error_message
        channel.close()
        # Changed (still corrupt): tried and logged once more, and only once.
        # Replaced in one step: a poll that caught a write in progress (the file emptied,
        # then filled) saw two changes and logged twice (seen once under load).
        fresh = tmp_path / "saved_model.pb"
        fresh.write_bytes(os.urandom(3000))
        os.replace(fresh, base / "2" / "saved_model.pb")
        _wait_for(lambda: sum("could not load version 2" in m for m in records.messages) >= 2,
                  what="the changed version tried again")
        seen = len(polls)
        _wait_for(lambda: len(polls) >= seen + 20, what="20 more polls")
        failures = [m for m in records.messages if "could not load version 2" in m]
        assert len(failures) == 2, records.messages
    finally:
        srv.stop()
        logger.removeHandler(records)
        logger.setLevel(level)
