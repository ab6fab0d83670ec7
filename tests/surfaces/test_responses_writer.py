"""The Responses stream writer's text deltas, made from bytes prepared once per item, are byte for
byte the events the general event builder makes (gateway/surfaces/responses.py)."""

from __future__ import annotations

import orjson
import pytest

from gateway.surfaces.responses import _OpenItem


@pytest.mark.parametrize(
    "piece", ["hello", " ", 'quote " and \\ back', "línea\nnueva", "\u2028\U0001f600", "</script>"]
)
@pytest.mark.parametrize(("item_id", "index"), [("msg_abc_0", 0), ("msg_x_12", 12)])
def test_a_text_delta_is_the_event_the_general_builder_makes(piece: str, item_id: str, index: int) -> None:
    expected = orjson.dumps(
        {
            "type": "response.output_text.delta",
            "item_id": item_id,
            "output_index": index,
            "content_index": 0,
            "delta": piece,
            "logprobs": [],
            "sequence_number": 41,
        }
    )
    item = _OpenItem(index, item_id)
    assert item.text_delta(piece, 41) == expected
    assert item.text_delta(piece, 42) == expected.replace(b":41}", b":42}")
