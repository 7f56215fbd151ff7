"""Fixtures of the serving tests that need no trained model: a brute-force export of an
untrained encoder, loaded as a `Servable` (the request checks of both protocols, without a
server) and served by a `ModelServer` (the wiring of those checks end to end). The trained
model, its exports and the server on them are in tests/conftest.py."""

import os

import numpy as np
import pytest
from serving_helpers import _tiny_export


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory):
    """Version 1 of a brute-force export of an untrained SASRec encoder over raw ids
    100..139, max_length 30 and default_k 10 (as the trained serving model's): its path."""
    base = tmp_path_factory.mktemp("tiny") / "ml"
    return _tiny_export(base, np.arange(100, 140), max_length=30, default_k=10)


@pytest.fixture(scope="session")
def servable(tiny_export):
    """The tiny export loaded as the server loads a version, with the server's defaults."""
    from tfrs_logq.serving.options import ServerOptions
    from tfrs_logq.serving.servable import Servable

    options = ServerOptions(model_name="ml", model_base_path=os.path.dirname(tiny_export))
    loaded = Servable(tiny_export, 1, options)
    yield loaded
    loaded.close()


@pytest.fixture(scope="session")
def tiny_server(tiny_export):
    """A `ModelServer` on the tiny export, model name "ml", requests of at most 200 kB."""
    from tfrs_logq.serving.server import ModelServer, ServerOptions

    options = ServerOptions(model_name="ml", port=0, rest_api_port=0,
                            model_base_path=os.path.dirname(tiny_export),
                            file_system_poll_wait_seconds=0.2, max_request_bytes=200_000)
    server = ModelServer(options).start()
    yield server
    server.stop(0)
