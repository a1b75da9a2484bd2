"""The pod-mode shared secret: --token_file (a mounted Kubernetes Secret) or XRUN_TOKEN, or none."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xrun.errors import UsageError
from xrun.runner.pod.secret import TOKEN_ENV, UNAUTHENTICATED_NOTICE, auth_notice, load_token, pod_key


def test_no_token_means_unauthenticated():
    assert load_token({}, None) is None
    assert auth_notice(None) == UNAUTHENTICATED_NOTICE and "\n" not in UNAUTHENTICATED_NOTICE
    assert pod_key(None, run_id="xrun-m-1") == pod_key(None, run_id="xrun-m-1") != pod_key(None, run_id="xrun-m-2")


def test_token_from_the_environment():
    assert load_token({TOKEN_ENV: "s3cr3t-s3cr3t-s3cr3t"}, None) == "s3cr3t-s3cr3t-s3cr3t"
    assert auth_notice("s3cr3t-s3cr3t-s3cr3t") is None
    key = pod_key("s3cr3t-s3cr3t-s3cr3t", run_id="r")
    assert len(key) == 32 and key != pod_key("s3cr3t-s3cr3t-s3cr3u", run_id="r") != pod_key(None, run_id="r")
    assert b"s3cr3t" not in key
    with pytest.raises(UsageError, match="XRUN_TOKEN: is set but empty"):
        load_token({TOKEN_ENV: "  "}, None)


def test_token_file_wins_and_loses_its_trailing_newline(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("from-file-0123456789\r\n")
    assert load_token({TOKEN_ENV: "from-env-0123456789"}, str(secret)) == "from-file-0123456789"


def test_kubernetes_secret_mount_is_a_symlink(tmp_path):
    data = tmp_path / "..2024_01_01" / "token"
    data.parent.mkdir()
    data.write_text("k8s-0123456789abcdef\n")
    (tmp_path / "..data").symlink_to(data.parent.name)
    (tmp_path / "token").symlink_to(os.path.join("..data", "token"))
    assert load_token({}, str(tmp_path / "token")) == "k8s-0123456789abcdef"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("\n", "is empty; put the job's shared secret in it"),
        ("x" * (64 << 10) + "x", "is larger than 65536 bytes"),
    ],
)
def test_bad_token_file_names_the_file(tmp_path, content, message):
    secret = tmp_path / "token"
    secret.write_text(content)
    with pytest.raises(UsageError) as err:
        load_token({}, str(secret))
    assert str(err.value).startswith(f"--token_file: {secret}: {message}")


def test_token_file_must_be_a_regular_file(tmp_path):
    with pytest.raises(UsageError, match=f"--token_file: {tmp_path}: is not a regular file"):
        load_token({}, str(tmp_path))
    with pytest.raises(UsageError, match="no such file"):
        load_token({}, str(tmp_path / "absent"))


def test_a_short_secret_is_refused_naming_its_length_and_how_to_make_one(tmp_path):
    fix = "at least 16 are needed (a short one is guessed in seconds); make one with `openssl rand -hex 32`"
    with pytest.raises(UsageError) as err:
        load_token({TOKEN_ENV: "1234"}, None)
    assert str(err.value) == f"XRUN_TOKEN: the shared secret is 4 character(s) long, {fix}" and err.value.exit_code == 2
    secret = tmp_path / "token"
    secret.write_text("x" * 15 + "\n")
    with pytest.raises(UsageError) as err:
        load_token({}, str(secret))
    assert str(err.value) == f"--token_file: {secret}: the shared secret is 15 character(s) long, {fix}"
    secret.write_text("x" * 16)
    assert load_token({TOKEN_ENV: "x" * 16}, None) == load_token({}, str(secret)) == "x" * 16


def test_without_a_secret_the_notice_says_who_can_join_and_the_fix():
    line = auth_notice(None)
    assert line is not None and "\n" not in line
    assert "anyone who can reach node 0's control port can join this job or end it" in line
    assert "kubectl create secret generic xrun-token --from-literal=token=$(openssl rand -hex 32)" in line
    assert "--token_file /etc/xrun/token" in line


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=40))
def test_any_file_content_is_a_token_or_a_one_line_error(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("t") / "token"
    path.write_bytes(content)
    try:
        token = load_token({}, str(path))
    except UsageError as err:
        assert err.exit_code == 2 and "\n" not in str(err) and str(path) in str(err)
        return
    assert token and token.strip() and not token.endswith(("\n", "\r"))
