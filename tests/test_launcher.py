"""The run launcher tells a start request that outlived its gRPC deadline (the code server may still be starting the
worker: leave the run to run monitoring) from a code server that could not be reached (no worker: fail the launch).

The errors are the real ones: Dagster's gRPC client against a real gRPC server on loopback that answers StartRun
only after the client's deadline, and against a port nothing listens on. (The client's `start_run` waits Dagster's
fixed 60 s; `_query` is the call it makes, with the deadline shortened.)
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc  # type: ignore[import-untyped]
import pytest
from dagster._core.errors import DagsterUserCodeUnreachableError
from dagster._grpc.__generated__ import dagster_api_pb2
from dagster._grpc.client import DagsterGrpcClient

from icemaint.app.launcher import start_outlived_its_deadline
from test_dagster_dev import free_port


@pytest.fixture
def slow_code_server():
    """A gRPC server whose StartRun replies once the test lets it (after the client's deadline); its port."""
    release = threading.Event()

    def start_run(request, context):
        release.wait(30)
        return dagster_api_pb2.StartRunReply(serialized_start_run_result="")

    handler = grpc.method_handlers_generic_handler("api.DagsterApi", {"StartRun": grpc.unary_unary_rpc_method_handler(
        start_run, request_deserializer=dagster_api_pb2.StartRunRequest.FromString,
        response_serializer=dagster_api_pb2.StartRunReply.SerializeToString)})
    server = grpc.server(ThreadPoolExecutor(2), handlers=(handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        release.set()
        server.stop(grace=None)


def start_run_error(port: int, deadline_s: int) -> DagsterUserCodeUnreachableError:
    with pytest.raises(DagsterUserCodeUnreachableError) as raised:
        DagsterGrpcClient(port=port, host="127.0.0.1")._query(
            "StartRun", dagster_api_pb2.StartRunRequest, timeout=deadline_s, serialized_execute_run_args="{}")
    return raised.value


def test_a_start_request_past_its_deadline_is_left_to_run_monitoring(slow_code_server):
    assert start_outlived_its_deadline(start_run_error(slow_code_server, 1))


def test_a_code_server_that_cannot_be_reached_fails_the_launch():
    assert not start_outlived_its_deadline(start_run_error(free_port(), 10))
    assert not start_outlived_its_deadline(DagsterUserCodeUnreachableError("Could not reach user code server"))
    assert not start_outlived_its_deadline(TimeoutError("not from gRPC"))
