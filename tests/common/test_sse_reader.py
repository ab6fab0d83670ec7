"""The SSE reader against the HTML standard's parsing rules, fed whole and in every cut."""

from __future__ import annotations

import pytest

from common.sse_reader import SseEvent, SseReader, SseTooLarge, is_done, read_events

BOM = b"\xef\xbb\xbf"


def fed_in_two(body: bytes, cut: int) -> list[SseEvent]:
    reader = SseReader()
    return reader.feed(body[:cut]) + reader.feed(body[cut:]) + reader.close()


def fed_bytewise(body: bytes) -> list[SseEvent]:
    reader = SseReader()
    events = [event for i in range(len(body)) for event in reader.feed(body[i : i + 1])]
    return events + reader.close()


def test_each_data_line_ends_with_a_blank_line_as_one_event() -> None:
    assert read_events(b'data: {"a":1}\n\ndata: [DONE]\n\n') == [
        (b'{"a":1}', b"message", b""),
        (b"[DONE]", b"message", b""),
    ]


def test_data_lines_of_one_event_are_joined_with_lf() -> None:
    assert read_events(b"data: first\ndata: second\ndata:\n\n") == [(b"first\nsecond\n", b"message", b"")]


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_lf_crlf_and_cr_end_lines_alike(end: bytes) -> None:
    body = b": keep-alive" + end + end + b"event: delta" + end + b"data: x" + end + b"data: y" + end + end
    assert read_events(body) == [(b"x\ny", b"delta", b"")]


def test_a_crlf_cut_between_reads_is_one_line_end() -> None:
    reader = SseReader()
    assert reader.feed(b"data: a\r\n\r") == [(b"a", b"message", b"")]  # the CR ends the event at once
    assert reader.feed(b"\ndata: b\r\n\r\n") == [(b"b", b"message", b"")]  # its LF is not another line


def test_an_empty_read_after_a_cr_does_not_make_its_lf_a_line() -> None:
    reader = SseReader()
    assert reader.feed(b"data: a\r") == []
    assert reader.feed(b"") == []
    assert reader.feed(b"\n\n") == [(b"a", b"message", b"")]


def test_comments_and_events_without_data_dispatch_nothing() -> None:
    assert read_events(b": ping\n\nevent: lonely\n\nid: 7\n\nretry: 100\n\n") == []


def test_one_space_after_the_colon_is_dropped_and_none_is_needed() -> None:
    assert read_events(b"data:x\n\ndata:  two spaces\n\n") == [
        (b"x", b"message", b""),
        (b" two spaces", b"message", b""),
    ]


def test_a_field_name_without_colon_has_an_empty_value() -> None:
    assert read_events(b"data\n\n") == [(b"", b"message", b"")]


def test_the_event_type_holds_for_one_event_only() -> None:
    assert read_events(b"event: error\ndata: 1\n\ndata: 2\n\nevent:\ndata: 3\n\n") == [
        (b"1", b"error", b""),
        (b"2", b"message", b""),
        (b"3", b"message", b""),
    ]


def test_the_last_id_stays_until_another_and_an_id_with_nul_is_ignored() -> None:
    assert read_events(b"id: 1\ndata: a\n\ndata: b\n\nid: 2\0\ndata: c\n\nid:\ndata: d\n\n") == [
        (b"a", b"message", b"1"),
        (b"b", b"message", b"1"),
        (b"c", b"message", b"1"),
        (b"d", b"message", b""),
    ]


def test_unknown_fields_are_ignored() -> None:
    assert read_events(b"dataX: no\nfoo: bar\ndata: yes\n\n") == [(b"yes", b"message", b"")]


def test_a_leading_bom_is_dropped_even_cut_across_reads_and_only_there() -> None:
    body = BOM + b"data: a\n\n" + BOM + b"data: b\n\n"
    # The second BOM makes an unknown field name: the standard drops only the first.
    assert read_events(body) == [(b"a", b"message", b"")]
    assert fed_bytewise(body) == [(b"a", b"message", b"")]


def test_an_event_the_stream_ended_in_without_its_blank_line_is_taken_on_close() -> None:
    reader = SseReader()
    assert reader.feed(b"data: 1\n\ndata: [DONE]") == [(b"1", b"message", b"")]
    assert reader.close() == [(b"[DONE]", b"message", b"")]
    assert SseReader().close() == []


def test_a_text_body_reads_like_its_utf8_bytes() -> None:
    assert read_events("data: é\n\n") == [("é".encode(), b"message", b"")]


SAMPLE = (
    BOM + b': hello\r\n\r\nid: 3\r\nevent: delta\r\ndata: {"a":\r\ndata: 1}\r\n\r\n'
    b"data: x\rdata: y\r\rretry: 5\ndata\n\ndata: [DONE]\n\n"
)


def test_every_cut_of_a_stream_reads_the_same_as_the_whole() -> None:
    whole = read_events(SAMPLE)
    assert whole == [
        (b'{"a":\n1}', b"delta", b"3"),
        (b"x\ny", b"message", b"3"),
        (b"", b"message", b"3"),
        (b"[DONE]", b"message", b"3"),
    ]
    for cut in range(len(SAMPLE) + 1):
        assert fed_in_two(SAMPLE, cut) == whole, cut
    assert fed_bytewise(SAMPLE) == whole


def test_a_line_beyond_the_bound_is_refused_however_it_is_cut() -> None:
    reader = SseReader(max_event_bytes=1000)
    reader.feed(b"data: ")
    for _ in range(99):  # a line that never ends, 10 bytes a read: 996 bytes so far
        assert reader.feed(b"x" * 10) == []
    with pytest.raises(SseTooLarge, match="more than 1000 bytes"):
        reader.feed(b"x" * 10)


def test_an_event_of_many_lines_beyond_the_bound_is_refused() -> None:
    reader = SseReader(max_event_bytes=1000)
    with pytest.raises(SseTooLarge):
        reader.feed(b"data: " + b"y" * 100 + b"\n" * 1 + (b"data: " + b"y" * 100 + b"\n") * 20)


def test_a_long_line_over_many_reads_reads_as_the_whole() -> None:
    line = b'data: {"content":"' + b"z" * 100_000 + b'"}\n\n'
    reader = SseReader()
    events = [e for i in range(0, len(line), 1000) for e in reader.feed(line[i : i + 1000])] + reader.close()
    assert events == read_events(line)
    assert len(events) == 1


@pytest.mark.parametrize("marker", [b"[DONE]", b"[DONE] ", b" [DONE]\t"])
def test_the_end_marker_is_known_with_whitespace_around_it(marker: bytes) -> None:
    ((data, _, _),) = read_events(b"data: " + marker + b"\n\n")
    assert is_done(data)
    assert not is_done(b'{"content":"[DONE]"}')
