"""ORCH_CLIENT_TIMEOUT in the Python client: the same default and syntax as the orch command's,
and a sentence naming the socket when a daemon stays silent."""

import os
import socket
import threading
import time

import pytest

import orch
from orch import _daemon


def test_the_bound_reads_seconds_or_a_duration_and_refuses_anything_else(monkeypatch):
    parse = _daemon.parse_duration
    assert parse("90s") == 90 and parse(" 2h 30m ") == 9000 and parse("0.5") == 0.5
    assert parse("250ms") == 0.25 and parse("1.5h") == 5400 and parse("30") == 30
    for bad in ["", "s", "0", "0s", "-1s", "-3", "10 parsecs", "soon", "nan", "inf"]:
        assert parse(bad) is None, bad
    monkeypatch.delenv("ORCH_CLIENT_TIMEOUT", raising=False)
    assert _daemon.answer_timeout() == 30.0
    monkeypatch.setenv("ORCH_CLIENT_TIMEOUT", "2m")
    assert _daemon.answer_timeout() == 120.0
    monkeypatch.setenv("ORCH_CLIENT_TIMEOUT", "soon")
    with pytest.raises(orch.BadRequest, match="ORCH_CLIENT_TIMEOUT=soon is not a duration"):
        _daemon.answer_timeout()


def test_a_silent_daemon_is_given_up_on_with_a_sentence(monkeypatch, tmp_path):
    path = str(tmp_path / "silent.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    held = []
    threading.Thread(target=lambda: held.append(listener.accept()), daemon=True).start()
    monkeypatch.setenv("ORCH_CLIENT_TIMEOUT", "1")
    started = time.monotonic()
    with pytest.raises(orch.OrchError) as e:
        _daemon.call(path, "GET", "/v1/jobs")
    assert time.monotonic() - started < 5
    assert f"the orch daemon at {path} did not answer within 1s (ORCH_CLIENT_TIMEOUT)" in str(
        e.value
    )
    listener.close()
