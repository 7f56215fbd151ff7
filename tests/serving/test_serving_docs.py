"""docs/serving.md's request examples, run as written against a server (of an untrained
export): the curl command and the Python gRPC client (only the address and the model name
are replaced)."""

import contextlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def _block(language: str, marker: str) -> str:
    """The one fenced ``language`` block of docs/serving.md that contains ``marker``."""
    blocks = [b for b in re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)
              if marker in b]
    assert len(blocks) == 1, f"{len(blocks)} {language} blocks with {marker!r} in {DOC}"
    return blocks[0]


def _for(server, text: str) -> str:
    return (text.replace("localhost:8501", f"127.0.0.1:{server.rest_port}")
            .replace("localhost:8500", f"127.0.0.1:{server.port}")
            .replace('"ml1m"', '"ml"').replace("/models/ml1m:", "/models/ml:"))


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_the_curl_example_of_docs_serving_md_answers_5_items(tiny_server):
    command = _block("sh", "curl")
    assert command.startswith("curl ") and ":predict" in command
    out = subprocess.run(["bash", "-c", _for(tiny_server, command)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    reply = json.loads(out)
    assert [len(row) for row in reply["outputs"]["item_ids"]] == [5], reply
    assert [len(row) for row in reply["outputs"]["scores"]] == [5], reply


def test_the_grpc_example_of_docs_serving_md_answers_5_items(tiny_server):
    code = _block("python", "PredictionServiceStub")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        namespace: dict = {}
        exec(compile(_for(tiny_server, code), str(DOC), "exec"), namespace)  # noqa: S102
    namespace["channel"].close()
    assert namespace["response"].outputs["item_ids"].tensor_shape.dim[1].size == 5
    assert printed.getvalue().startswith("[[") and len(printed.getvalue().split()) == 5, \
        printed.getvalue()
