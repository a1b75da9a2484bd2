"""Asking ranks' endpoints (xrun.launch.telemetry.client) with real Unix sockets: a rank that ends while asked
(its socket closed unanswered, or after part of its answer) is that rank's problem; the others' answers stand."""

from __future__ import annotations

import socket
import threading

from xrun.launch.telemetry.client import ENDPOINT_GONE, NO_ENDPOINT, ask


def serve_once(path, answer: bytes):
    """A one-request endpoint on ``path`` that reads the request, writes ``answer`` and closes."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(1)

    def run():
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(answer)
        listener.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_rank_that_closes_while_asked_is_its_own_problem_and_the_others_answers_stand(tmp_path):
    answers = {"whole": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "closed": b"",
               "partial": b"HTTP/1.1 200 OK\r\nContent-Le", "garbage": b"\x00\x01 not a status line"}
    threads = [serve_once(tmp_path / f"{name}.sock", answer) for name, answer in answers.items()]
    questions = {name: (str(tmp_path / f"{name}.sock"), "fr_trace_json") for name in [*answers, "gone"]}
    replies = ask(questions, 10.0)
    for thread in threads:
        thread.join(5)
    assert replies["whole"].body == b"ok" and replies["whole"].error is None
    assert replies["closed"].body is None
    assert replies["closed"].error == "the endpoint closed the connection without an answer (the rank was ending?)"
    assert replies["partial"].error == ("the endpoint closed the connection after 27 bytes of its answer "
                                        "(the rank was ending?)")
    assert replies["garbage"].error == "the endpoint's answer is not HTTP"
    assert replies["gone"].error == NO_ENDPOINT and not any(r.timed_out for r in replies.values())


def test_no_socket_is_no_endpoint_and_a_socket_nobody_listens_on_is_a_rank_gone(tmp_path):
    """A rank that never served has no socket; one that died without its exit path (SIGKILL, os._exit) left its
    socket's name with nobody listening (issue 37 §6): the two read differently."""
    left = socket.socket(socket.AF_UNIX)
    left.bind(str(tmp_path / "killed.sock"))
    left.close()  # bound, never listened: what a killed rank leaves
    replies = ask({name: (str(tmp_path / f"{name}.sock"), "fr_trace_json") for name in ("never", "killed")}, 5.0)
    assert replies["never"].error == NO_ENDPOINT and replies["never"].absent
    assert replies["killed"].error == ENDPOINT_GONE and not replies["killed"].absent
