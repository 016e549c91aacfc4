"""The live client's request deadline: what it counts as its own, and the bound its message
names. A socket's timeout is the deadline's (its errno is None); the network's ETIMEDOUT is
an OSError that Python also makes a TimeoutError, and is not."""

from __future__ import annotations

import errno
import os
import socket

import pytest

from eaglegate.live.client import LiveRequestError, _Deadline, first_model, resolve_endpoint


def _socket_timeout() -> TimeoutError:
    """The exception a read raises when its socket's timeout passes, from a real socket."""
    left, right = socket.socketpair()
    with left, right:
        left.settimeout(0.01)
        try:
            left.recv(1)
        except TimeoutError as exc:
            return exc
    raise AssertionError("a read with nothing to read returned")


def test_a_socket_timeout_is_the_deadline_and_the_networks_etimedout_is_not():
    deadline = _Deadline(300)
    network = OSError(errno.ETIMEDOUT, os.strerror(errno.ETIMEDOUT))
    assert isinstance(network, TimeoutError)  # which is why the errno decides
    assert deadline.ended(_socket_timeout())
    assert not deadline.ended(network)


def test_the_model_list_names_its_own_bound_not_the_timeout_option():
    # A listener that takes the connection and never answers.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        with pytest.raises(LiveRequestError) as raised:
            first_model(resolve_endpoint(f"127.0.0.1:{port}"), timeout=0.2)
    message = str(raised.value)
    assert message.startswith(f"http://127.0.0.1:{port}/v1/completions did not answer within 0.2 s "
                              "(the model list is asked within 0.2 s, whatever --timeout says")
    assert "--timeout bounds each request" not in message
