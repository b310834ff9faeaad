"""The noise count every upstream transport shares (``noise.py``): its window starts at a
stream's last message. The transports' own tests (``tests/faults/test_upstream_noise.py``,
``tests/faults/test_stream_noise.py``, ``tests/test_websocket_peers.py``) show each one
letting its stream go."""

from __future__ import annotations

import time

import pytest

from agent_gateway.noise import QUIET_LINES, QUIET_WINDOW, START_ALLOWANCE, QuietCount, UpstreamNoise


def test_a_message_restarts_the_window() -> None:
    # The window ran from the count's start (or last reset), not from the last message: a
    # stream that had served past a window's length let its first flood through.
    quiet = QuietCount(since=time.monotonic() - 2 * QUIET_WINDOW)  # serving for 20 s
    quiet.message()
    with pytest.raises(UpstreamNoise, match=f"over {QUIET_LINES} lines"):
        quiet.heard(QUIET_LINES + 1, QUIET_LINES + 1)


def test_noise_past_the_bound_after_a_window_without_one_starts_the_next_window() -> None:
    quiet = QuietCount(since=time.monotonic() - 2 * QUIET_WINDOW)  # noise, but under the bound
    quiet.heard(QUIET_LINES, QUIET_LINES)
    quiet.heard(QUIET_LINES, QUIET_LINES)  # past it, a window later: the next one's start
    with pytest.raises(UpstreamNoise):
        quiet.heard(1, 1)


def test_bytes_that_may_still_end_as_a_message_are_not_noise_yet() -> None:
    quiet = QuietCount("bytes")
    quiet.heard(0, 1 << 20, pending=1 << 20)  # one large message, not yet ended
    with pytest.raises(UpstreamNoise, match="or 65536 bytes"):
        quiet.heard(0, 0, pending=0)  # it ended as no message


def test_the_start_allowance_ends_with_the_first_message() -> None:
    quiet = QuietCount(allowance=START_ALLOWANCE)
    quiet.heard(START_ALLOWANCE * QUIET_LINES, 0)  # a banner
    quiet.message()
    with pytest.raises(UpstreamNoise, match=f"over {QUIET_LINES} lines"):
        quiet.heard(QUIET_LINES + 1, 0)
