"""The agent's side of the engine backends: node rank from the engine's variables, the token by name, and
the engine's process identity kept away from the ranks."""

from __future__ import annotations

import os

import pytest

from xrun.errors import UsageError
from xrun.launch.engine_env import drop_engine_identity
from xrun.launch.session.main import build_parser, node_rank_from, read_token


def test_node_rank_from_first_set_variable():
    assert node_rank_from("OMPI_COMM_WORLD_RANK,PMIX_RANK", {"PMIX_RANK": "2"}) == 2
    assert node_rank_from("OMPI_COMM_WORLD_RANK,PMIX_RANK", {"OMPI_COMM_WORLD_RANK": "1", "PMIX_RANK": "2"}) == 1


def test_node_rank_from_errors():
    with pytest.raises(UsageError, match="none of PMI_RANK, PMIX_RANK is set: was this agent started by the engine"):
        node_rank_from("PMI_RANK,PMIX_RANK", {})
    with pytest.raises(UsageError, match="SLURM_PROCID='x' is not a node index"):
        node_rank_from("SLURM_PROCID", {"SLURM_PROCID": "x"})


def test_node_rank_and_node_rank_from_exclude_each_other():
    parser = build_parser()
    ns = parser.parse_args(["--connect=h:1", "--node_rank_from=PMI_RANK", "--token=env:T"])
    assert ns.node_rank is None and ns.node_rank_from == "PMI_RANK"
    with pytest.raises(UsageError):
        parser.parse_args(["--connect=h:1", "--node_rank=0", "--node_rank_from=PMI_RANK"])
    with pytest.raises(UsageError):
        parser.parse_args(["--connect=h:1"])


def test_token_from_env_is_taken_out(monkeypatch):
    monkeypatch.setenv("XRUN_TEST_TOKEN", "abc123")
    assert read_token("env:XRUN_TEST_TOKEN") == "abc123"
    assert "XRUN_TEST_TOKEN" not in os.environ
    with pytest.raises(UsageError, match="XRUN_TEST_TOKEN is not set; the launcher exports it"):
        read_token("env:XRUN_TEST_TOKEN")


def test_drop_engine_identity_keeps_the_job():
    env = {
        "OMPI_COMM_WORLD_RANK": "0", "OMPI_MCA_orte_hnp_uri": "x", "PMIX_RANK": "0", "PMI_FD": "5",
        "PMI_RANK": "1", "MPI_LOCALRANKID": "0", "HYDI_CONTROL_FD": "7", "MV2_COMM_WORLD_RANK": "0",
        "SLURM_PROCID": "2", "SLURM_STEP_ID": "0", "SLURM_NODEID": "1", "SLURM_NTASKS": "3",
        "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-3]", "PATH": "/bin", "GLOO_SOCKET_IFNAME": "eth1",
    }
    dropped = drop_engine_identity(env)
    assert env == {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-3]", "PATH": "/bin", "GLOO_SOCKET_IFNAME": "eth1"}
    assert "OMPI_COMM_WORLD_RANK" in dropped and "SLURM_STEP_ID" in dropped
