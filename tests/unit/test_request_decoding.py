"""The decoding boundary's pure pieces: which handlers it wraps, and how it parses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from chronoshard.scheduler.api import boundary
from chronoshard.v1 import common_pb2


async def _async_unary(request: Any, context: Any) -> Any:
    return request


def _sync_unary(request: Any, context: Any) -> Any:
    return request


async def _async_stream(request: Any, context: Any) -> AsyncIterator[Any]:
    yield request


def _decode(raw: bytes) -> common_pb2.ErrorInfo:
    return common_pb2.ErrorInfo.FromString(raw)


@pytest.mark.parametrize(
    ("handler", "shape"),
    [
        (grpc.unary_unary_rpc_method_handler(_async_unary), (False, False)),
        (grpc.unary_stream_rpc_method_handler(_async_stream), (False, True)),
        (grpc.stream_unary_rpc_method_handler(_async_unary), (True, False)),
        (grpc.stream_stream_rpc_method_handler(_async_stream), (True, True)),
    ],
)
def test_the_shape_names_the_behaviour(handler: grpc.RpcMethodHandler, shape: Any) -> None:
    assert boundary.streaming_of(handler) == shape
    assert boundary.behaviour_of(handler) in (_async_unary, _async_stream)


def test_only_async_handlers_with_a_deserializer_decode_inside() -> None:
    with_decoder = grpc.unary_unary_rpc_method_handler(_async_unary, _decode)
    assert boundary.decodes_inside(with_decoder)
    assert boundary.decodes_inside(grpc.unary_stream_rpc_method_handler(_async_stream, _decode))
    no_decoder = grpc.unary_unary_rpc_method_handler(_async_unary)
    sync = grpc.unary_unary_rpc_method_handler(_sync_unary, _decode)
    assert not boundary.decodes_inside(no_decoder)
    assert not boundary.decodes_inside(sync)
    # Those are handed back as they are.
    assert boundary.decoding_handler(no_decoder, "/s/M") is no_decoder
    assert boundary.decoding_handler(sync, "/s/M") is sync


def test_wrapped_handlers_keep_their_shape_and_take_bytes() -> None:
    handler = grpc.stream_stream_rpc_method_handler(
        _async_stream, _decode, common_pb2.ErrorInfo.SerializeToString
    )
    wrapped = boundary.decoding_handler(handler, "/s/M")
    assert boundary.streaming_of(wrapped) == (True, True)
    assert wrapped.request_deserializer is None
    assert wrapped.response_serializer is common_pb2.ErrorInfo.SerializeToString


async def test_a_stream_ends_at_its_first_undecodable_message() -> None:
    parse = boundary._parser(_decode, "/s/M")
    good = common_pb2.ErrorInfo(code="OK").SerializeToString()

    async def raw() -> AsyncIterator[bytes]:
        for chunk in (good, b"\xff\xff\xff", good):
            yield chunk

    bad: list[bool] = []
    decoded = [message async for message in boundary._messages(parse, raw(), bad)]
    assert [message.code for message in decoded] == ["OK"]
    assert bad == [True]


def test_the_parser_turns_any_decoder_error_into_undecodable() -> None:
    parse = boundary._parser(_decode, "/s/M")
    assert parse(common_pb2.ErrorInfo(code="X").SerializeToString()).code == "X"
    with pytest.raises(boundary._Undecodable):
        parse(b"\xff\xff\xff")


def test_malformed_names_the_method() -> None:
    info = boundary.malformed("/chronoshard.v1.TaskService/SubmitTask")
    assert (info.code, info.reason) == ("INVALID_ARGUMENT", boundary.MALFORMED_REQUEST)
    assert "SubmitTask" in info.message
