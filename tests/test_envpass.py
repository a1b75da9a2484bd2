"""What travels to remote nodes: prefixes, .xrun_env files, --export, blocked names."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xrun.errors import EnvFileError, UsageError
from xrun.runner import envpass
from xrun.runner.envpass import collect, env_files, parse_env_text, parse_export


def test_prefixes_travel_and_session_names_do_not():
    environ = {
        "NCCL_DEBUG": "INFO", "PYTHONUNBUFFERED": "1", "UCX_TLS": "tcp", "MV2_X": "1", "MLFLOW_URI": "u",
        "GLOO_SOCKET_IFNAME": "eth0", "TORCH_CPP_LOG_LEVEL": "ERROR", "CUDA_LAUNCH_BLOCKING": "1", "HF_HOME": "/h",
        "WANDB_API_KEY": "k", "HOME": "/root", "PATH": "/bin", "SSH_AUTH_SOCK": "/s", "PWD": "/x", "USER": "me",
        "HFX": "no", "BASH_FUNC_x%%": "() {}",
    }
    assert envpass.from_environment(environ) == {
        k: environ[k] for k in ("NCCL_DEBUG", "PYTHONUNBUFFERED", "UCX_TLS", "MV2_X", "MLFLOW_URI",
                                "GLOO_SOCKET_IFNAME", "TORCH_CPP_LOG_LEVEL", "CUDA_LAUNCH_BLOCKING", "HF_HOME",
                                "WANDB_API_KEY")
    }


def test_env_file_syntax():
    text = (
        "# comment\n\n"
        "A=plain\n"
        "  export B = spaced value  \n"
        "C='single $x \"q\" \\n'\n"
        'D="dq \\"x\\" \\\\ \\$y\\nnext\\t"\n'
        "E=trail # comment\n"
        "F=\n"
        "G=a=b\n"
        "H='' # empty\n"
        "I=x#y\n"
        "J=ünï ✓\r\n"
    )
    assert parse_env_text(text, "f") == {
        "A": "plain", "B": "spaced value", "C": 'single $x "q" \\n', "D": 'dq "x" \\ $y\nnext\t', "E": "trail",
        "F": "", "G": "a=b", "H": "", "I": "x#y", "J": "ünï ✓",
    }


@pytest.mark.parametrize(
    "line, reason",
    [
        ("JUSTANAME", "expected KEY=VALUE"),
        ("1X=a", "is not a variable name"),
        ("A B=c", "is not a variable name"),
        ("A='open", "unterminated single quote"),
        ('A="open', "unterminated double quote"),
        ("A='x' y", "unexpected text after the closing quote"),
        ('A="\\q"', "unknown escape"),
        ("A=it's", "quotes inside an unquoted value"),
        ("HOME=/x", "never travels"),
        ("SSH_AUTH_SOCK=/x", "never travels"),
    ],
)
def test_malformed_lines_name_path_and_line(line, reason):
    with pytest.raises(EnvFileError) as info:
        parse_env_text(f"# ok\nOK=1\n{line}\n", "/home/u/.xrun_env")
    err = info.value
    assert (err.path, err.lineno) == ("/home/u/.xrun_env", 3) and reason in err.reason
    assert str(err).startswith("/home/u/.xrun_env:3: ")


def test_exports():
    assert parse_export("A=x=y", {}) == ("A", "x=y")
    assert parse_export("A", {"A": "from env"}) == ("A", "from env")
    for bad in ("A", "=x", "1A=x", "HOME=/x", "SSH_X=1"):
        with pytest.raises(UsageError):
            parse_export(bad, {})


def test_precedence_and_pythonpath(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    (home / ".xrun_env").write_text("A=home\nB=home\nNCCL_X=file\n")
    (cwd / ".xrun_env").write_text("B=cwd\nC=cwd\n")
    env = collect(
        {"NCCL_X": "env", "PYTHONPATH": "/lib", "D": "from shell"},
        exports=["C=flag", "D"],
        files=env_files(str(home), str(cwd)),
        cwd=str(cwd),
    )
    assert env == {"A": "home", "B": "cwd", "C": "flag", "D": "from shell", "NCCL_X": "file",
                   "PYTHONPATH": f"{cwd}:/lib"}


def test_missing_env_files_are_empty(tmp_path):
    assert collect({}, files=env_files(str(tmp_path), str(tmp_path)), cwd="/w") == {"PYTHONPATH": "/w"}


NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(lambda n: not envpass.is_blocked(n))
VALUE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)


def quote_double(value):
    escapes = {"\\": "\\\\", '"': '\\"', "$": "\\$", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    return '"' + "".join(escapes.get(c, c) for c in value) + '"'


@given(st.dictionaries(NAME, VALUE, max_size=6))
def test_fuzz_double_quoted_values_round_trip(env):
    text = "\n".join(f"{k}={quote_double(v)}" for k, v in env.items())
    assert parse_env_text(text, "f") == env


@given(st.text(max_size=40))
def test_fuzz_any_text_parses_or_names_its_line(text):
    try:
        parse_env_text(text, "f")
    except EnvFileError as err:
        assert err.path == "f" and 1 <= err.lineno <= text.count("\n") + 1
