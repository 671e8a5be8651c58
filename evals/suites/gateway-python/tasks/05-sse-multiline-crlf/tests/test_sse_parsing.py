from streaming.sse import SSEEvent, iter_data, parse_sse


def lines_of(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def test_multi_line_data_is_joined_with_newlines() -> None:
    stream = lines_of("data: first\ndata: second\ndata: third\n\n")
    assert list(parse_sse(stream)) == [SSEEvent("first\nsecond\nthird")]


def test_crlf_stream() -> None:
    stream = lines_of("event: delta\r\nid: 7\r\ndata: a\r\ndata: b\r\n\r\ndata: c\r\n\r\n")
    assert list(parse_sse(stream)) == [SSEEvent("a\nb", "delta", "7"), SSEEvent("c")]


def test_only_one_leading_space_is_removed() -> None:
    stream = lines_of("data: Hello\n\ndata:  world\n\ndata:tight \n\n")
    assert [e.data for e in parse_sse(stream)] == ["Hello", " world", "tight "]


def test_field_without_colon_and_empty_data_lines() -> None:
    stream = lines_of("data\ndata: x\ndata:\n\n")
    assert list(parse_sse(stream)) == [SSEEvent("\nx\n")]


def test_comments_dropped_events_and_unterminated_tail() -> None:
    stream = lines_of(": keep-alive\n\nevent: ping\n\nretry: 10\ndata: ok\n\ndata: tail")
    assert list(parse_sse(stream)) == [SSEEvent("ok")]


def test_event_fields_reset_between_events() -> None:
    stream = lines_of("event: usage\nid: 1\ndata: {}\n\ndata: next\n\n")
    assert list(parse_sse(stream)) == [SSEEvent("{}", "usage", "1"), SSEEvent("next")]


def test_iter_data_stops_at_done_over_crlf() -> None:
    stream = lines_of(
        'data: {"t": "Hel"}\r\n\r\n'
        "event: usage\r\ndata: {}\r\n\r\n"
        'data: {"t": " lo"}\r\n\r\n'
        "data: [DONE]\r\n\r\n"
        "data: after\r\n\r\n"
    )
    assert list(iter_data(stream)) == ['{"t": "Hel"}', '{"t": " lo"}']
