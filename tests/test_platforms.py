"""Platform detection from literal environments and tmp files (what Kubeflow, Volcano, PBS, LSF... give a node)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xrun.errors import HostfileError, XrunError
from xrun.runner.hosts.batch_alloc import count_node_file, in_batch_job, mcpu_hosts
from xrun.runner.hosts.platform_values import MAX_NODES, PlatformError, parse_address, parse_count, parse_host_list
from xrun.runner.hosts.smallfile import SmallFileError, read_small_file
from xrun.runner.pod.platforms import Detection, Platform, detect, platform_markers_present


def no_files(path):
    raise SmallFileError(path, "no such file", missing=True)


def files(mapping):
    def read(path):
        if path not in mapping:
            return no_files(path)
        return mapping[path]

    return read


KUBEFLOW = {"PET_NNODES": "4", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456",
            "PET_NPROC_PER_NODE": "8", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "32",
            "RANK": "2"}
PAI = {"MASTER_ADDR": "dlc1-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "8", "RANK": "3", "NPROC_PER_NODE": "8"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # Kubeflow: PET_* are trusted; WORLD_SIZE (processes on newer operators) is not read.
        (KUBEFLOW, (Platform.KUBEFLOW, 2, 4, "job-master-0", 23456, 8)),
        # Trainer v2: PET_* only, nproc "auto" -> counted on the node.
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "t-node-0-0.t", "PET_MASTER_PORT": "29500",
          "PET_NPROC_PER_NODE": "auto", "JOB_COMPLETION_INDEX": "1"},
         (Platform.KUBEFLOW, 1, 2, "t-node-0-0.t", 29500, None)),
        # Elastic PyTorchJob: MIN:MAX, the max is planned.
        ({"PET_NNODES": "2:6", "PET_NODE_RANK": "5", "MASTER_ADDR": "m", "MASTER_PORT": "1"},
         (Platform.KUBEFLOW, 5, 6, "m", 1, None)),
        # PAI-DLC / older PyTorchJob: the generic variables read as pods.
        (PAI, (Platform.PYTORCHJOB, 3, 8, "dlc1-master-0", 23456, 8)),
        ({"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "2", "RANK": "0"},
         (Platform.PYTORCHJOB, 0, 2, "10.0.0.1", None, None)),
        # Volcano pytorch plugin: RANK = 0 for master, worker i -> i + 1; no host lists here.
        ({"MASTER_ADDR": "vj-master-0.vj", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2",
          "VC_TASK_INDEX": "1"}, (Platform.VOLCANO, 2, 3, "vj-master-0.vj", 23456, None)),
        # Volcano svc plugin only, one task: the task index and its host list.
        ({"VC_TASK_INDEX": "1", "VC_WORKER_HOSTS": "vj-worker-0.vj,vj-worker-1.vj", "VC_WORKER_NUM": "2"},
         (Platform.VOLCANO, 1, 2, "vj-worker-0.vj", None, None)),
        ({"LWS_LEADER_ADDRESS": "lws-0.lws.ns", "LWS_GROUP_SIZE": "4", "LWS_WORKER_INDEX": "3"},
         (Platform.LWS, 3, 4, "lws-0.lws.ns", None, None)),
        ({"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n", "SKYPILOT_NUM_NODES": "2",
          "SKYPILOT_NUM_GPUS_PER_NODE": "4"}, (Platform.SKYPILOT, 1, 2, "10.0.0.5", None, 4)),
        ({"JOB_COMPLETION_INDEX": "3"}, (Platform.INDEXED_JOB, 3, None, None, None, None)),
    ],
)
def test_pod_platforms(env, expected):
    found = detect(env, no_files)
    assert isinstance(found, Detection) and found.platform.pod
    assert (found.platform, found.node_rank, found.num_nodes, found.master_addr, found.master_port,
            found.slots_per_node) == expected
    assert found.announcement.startswith("xrun: ") and "\n" not in found.announcement


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"MASTER_ADDR": "somewhere"},  # a user's own export, not a platform
        {"WORLD_SIZE": "4"},
        # Inside a rank of torchrun or xrun the generic variables count processes.
        dict(PAI, LOCAL_RANK="0"),
        dict(PAI, TORCHELASTIC_RUN_ID="r"),
        # In a batch job they are the user's exports for torchrun; Slurm is slurm_alloc's.
        dict(PAI, SLURM_JOB_ID="12"),
        dict(KUBEFLOW, SLURM_JOB_ID="12"),
        {"PET_NNODES": " "},
    ],
)
def test_nothing_detected(env):
    assert detect(env, no_files) is None


def test_announcements_say_which_reading_was_taken():
    line = detect(PAI, no_files).announcement
    assert line == ("xrun: PyTorchJob-style variables (WORLD_SIZE, RANK): node 3 of 8, master dlc1-master-0:23456; "
                    "WORLD_SIZE=8 read as 8 nodes (pods); pass --num_nodes to override, or unset WORLD_SIZE and RANK to run on "
                    "this machine alone; "
                    "8 slot(s) per node from NPROC_PER_NODE")
    elastic = detect({"PET_NNODES": "2:6", "PET_NODE_RANK": "0"}, no_files).announcement
    assert "PET_NNODES=2:6 (elastic) read as its maximum, 6 nodes" in elastic
    assert "JOB_COMPLETION_INDEX" in detect({"JOB_COMPLETION_INDEX": "0"}, no_files).announcement


def test_kubeflow_without_a_rank_leaves_it_to_the_flag():
    found = detect({"PET_NNODES": "2"}, no_files)
    assert found.node_rank is None and "node rank not given" in found.announcement


def test_volcano_host_files_make_the_world(tmp_path):
    env = {"MASTER_ADDR": "vj-master-0.vj", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "1",
           "VC_TASK_INDEX": "0", "VC_MASTER_HOSTS": "ignored-when-the-file-exists", "VC_WORKER_HOSTS": "w0,w1"}
    read = files({"/etc/volcano/master.host": "vj-master-0.vj\n",
                  "/etc/volcano/worker.host": "vj-worker-0.vj\nvj-worker-1.vj\n"})
    found = detect(env, read)
    assert found.platform is Platform.VOLCANO
    assert found.hosts == ("vj-master-0.vj", "vj-worker-0.vj", "vj-worker-1.vj")
    # Without the files: the ConfigMap's variables (the same lists).
    env["VC_MASTER_HOSTS"] = "vj-master-0.vj"
    assert detect(env, no_files).hosts == ("vj-master-0.vj", "w0", "w1")
    # Lists that do not add up to WORLD_SIZE: no names (the nodes get numbered).
    assert detect(dict(env, WORLD_SIZE="4", RANK="3"), no_files).hosts == ()


def test_volcano_unreadable_host_file_names_the_variable(tmp_path):
    def read(path):
        raise SmallFileError(path, "is not a regular file")

    with pytest.raises(PlatformError, match=r"VC_WORKER_HOSTS='/etc/volcano/worker.host': is not a regular file"):
        detect({"VC_TASK_INDEX": "0", "VC_WORKER_HOSTS": "a"}, read)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PET_NNODES": "four", "PET_NODE_RANK": "0"}, "PET_NNODES='four': the node count must be a whole number"),
        ({"PET_NNODES": "4:2", "PET_NODE_RANK": "0"}, "PET_NNODES='4:2': MIN:MAX has MIN above MAX"),
        ({"PET_NNODES": "0", "PET_NODE_RANK": "0"}, "PET_NNODES='0': the node count must be in 1..65536"),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "2"}, "PET_NODE_RANK='2': is not below PET_NNODES=2"),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "many"},
         "PET_NPROC_PER_NODE='many': the processes per node (or auto) must be a whole number"),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_PORT": "70000"}, "PET_MASTER_PORT='70000': a TCP port"),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "a b"}, "PET_MASTER_ADDR='a b': not a host"),
        (dict(PAI, RANK="8"), "RANK='8': is not below WORLD_SIZE=8"),
        (dict(PAI, RANK="-1"), "RANK='-1': a node rank must be a whole number"),
        (dict(PAI, RANK="\u0663"), "RANK='\u0663': a node rank must be a whole number (ASCII digits)"),  # Arabic 3
        (dict(PAI, WORLD_SIZE="9" * 30), "WORLD_SIZE='" + "9" * 30 + "': the number of pods must be a whole"),
        (dict(PAI, WORLD_SIZE="100000"), "WORLD_SIZE='100000': the number of pods must be in 1..65536"),
        (dict(PAI, MASTER_ADDR="--evil"), "MASTER_ADDR='--evil': not a host name or IP address"),
        ({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "a\nb", "SKYPILOT_NUM_NODES": "3"},
         "SKYPILOT_NUM_NODES='3': but SKYPILOT_NODE_IPS lists 2 hosts"),
        ({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "fe80::1"}, "SKYPILOT_NODE_IPS='fe80::1': 'fe80::1' is not"),
        ({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "a\na"}, "SKYPILOT_NODE_IPS='a\\na': names a host twice"),
        ({"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "2"}, "LWS_WORKER_INDEX='2': is not below LWS_GROUP_SIZE=2"),
        ({"JOB_COMPLETION_INDEX": "x"}, "JOB_COMPLETION_INDEX='x': a node rank must be a whole number"),
        ({"VC_TASK_INDEX": "2", "VC_WORKER_HOSTS": "a,b"}, "VC_TASK_INDEX='2': is not below the task's 2 hosts"),
    ],
)
def test_bad_values_name_the_variable(env, message):
    with pytest.raises(PlatformError) as err:
        detect(env, no_files)
    assert str(err.value).startswith(message), str(err.value)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


def test_long_bad_values_are_cut_in_the_message():
    with pytest.raises(PlatformError) as err:
        detect(dict(PAI, RANK="x" * 10000), no_files)
    assert len(str(err.value)) < 200


# ---------------------------------------------------------------------------------------------------------------
# Batch systems: host pools for the head node.


def test_pbs_node_file_one_line_per_slot(tmp_path):
    nodefile = tmp_path / "42.pbs"
    nodefile.write_text("n2\nn2\nn1\nn2\n\nn3\n")
    found = detect({"PBS_JOBID": "42.pbs", "PBS_NODEFILE": str(nodefile)}, read_file)
    assert found.platform is Platform.PBS and not found.platform.pod
    assert found.pool == {"n2": (0, 1, 2), "n1": (0,), "n3": (0,)}  # first-seen order, a slot per line
    assert found.node_rank is None and found.num_nodes == 3
    assert found.announcement == f"xrun: using PBS job 42.pbs: 3 node(s), 5 slot(s) from PBS_NODEFILE={nodefile}"


def read_file(path):
    return read_small_file(path, limit=1 << 20)


def test_lsf_host_file_then_mcpu_hosts(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("hA\nhA\nhB\n")
    env = {"LSB_JOBID": "7", "LSB_DJOB_HOSTFILE": str(hostfile), "LSB_MCPU_HOSTS": "x 1"}
    assert detect(env, read_file).pool == {"hA": (0, 1), "hB": (0,)}
    found = detect({"LSB_JOBID": "7", "LSB_MCPU_HOSTS": "hA 4 hB 2"}, read_file)
    assert found.platform is Platform.LSF and found.pool == {"hA": (0, 1, 2, 3), "hB": (0, 1)}
    assert found.announcement == "xrun: using LSF job 7: 2 node(s), 6 slot(s) from LSB_MCPU_HOSTS"


def test_batch_detection_can_be_skipped(tmp_path):
    env = {"PBS_JOBID": "1", "PBS_NODEFILE": "/nonexistent"}
    assert detect(env, read_file, batch=False) is None  # -H given: the node file is not even read
    assert detect({"SLURM_JOB_ID": "5"}, read_file) is None  # Slurm: slurm_alloc's business
    assert in_batch_job({"LSB_JOBID": "3"}) and not in_batch_job({"LSB_JOBID": ""})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PBS_JOBID": "1"}, "PBS_NODEFILE='': not set although PBS_JOBID is; pass -H HOSTFILE"),
        ({"PBS_JOBID": "1", "PBS_NODEFILE": "/nonexistent/x"}, "PBS_NODEFILE='/nonexistent/x': no such file"),
        ({"PBS_JOBID": "1", "PBS_NODEFILE": "/"}, "PBS_NODEFILE='/': is not a regular file"),
        ({"LSB_JOBID": "1"}, "LSB_DJOB_HOSTFILE='': not set (nor LSB_MCPU_HOSTS) although LSB_JOBID is"),
        ({"LSB_JOBID": "1", "LSB_MCPU_HOSTS": "hA 4 hB"}, "LSB_MCPU_HOSTS='hA 4 hB': expected pairs 'HOST SLOTS'"),
        ({"LSB_JOBID": "1", "LSB_MCPU_HOSTS": "hA four"}, "LSB_MCPU_HOSTS='four': the slots of hA must be a whole"),
        ({"LSB_JOBID": "1", "LSB_MCPU_HOSTS": "hA 0"}, "LSB_MCPU_HOSTS='0': the slots of hA must be in 1..1024"),
        ({"LSB_JOBID": "1", "LSB_MCPU_HOSTS": "hA 1 hA 1"}, "LSB_MCPU_HOSTS='hA 1 hA 1': names host 'hA' twice"),
        ({"LSB_JOBID": "1", "LSB_MCPU_HOSTS": "h@A 1"}, "LSB_MCPU_HOSTS='h@A 1': 'h@A' is not a host name"),
    ],
)
def test_batch_errors_name_the_variable(env, message):
    with pytest.raises(PlatformError) as err:
        detect(env, read_file)
    assert str(err.value).startswith(message), str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("n1\nn2 slots=4\n", "NF:2: 'n2 slots=4': 'n2 slots=4' is not a host name"),
        ("n1\nbad:name\n", "NF:2: 'bad:name': 'bad:name' is not a host name"),
        ("\n\n", "NF: lists no hosts"),
        ("n1\n" * 1025, "NF:1025: 'n1': host 'n1' has more than 1024 slots"),
    ],
)
def test_bad_node_file_line_is_file_colon_line(text, message):
    with pytest.raises(HostfileError) as err:
        count_node_file(text, "NF")
    assert str(err.value).startswith(message), str(err.value)


def test_mcpu_hosts():
    assert mcpu_hosts("hA 4 hB 4") == (("hA", "hB"), (4, 4))


def test_mcpu_hosts_bound_the_ranks_in_all_before_the_pool():
    text = " ".join(f"h{i} 1024" for i in range(200))  # 204,800 slots: every host within its own limit
    with pytest.raises(PlatformError, match="the most ranks xrun accepts"):
        mcpu_hosts(text)


# ---------------------------------------------------------------------------------------------------------------
# The file reader: regular files only, capped, symlinks followed (Kubernetes mounts are symlinks).


def test_small_file_reader(tmp_path):
    good = tmp_path / "good"
    good.write_text("a\n")
    link = tmp_path / "link"
    link.symlink_to(good)
    assert read_small_file(str(link), limit=10) == "a\n"
    with pytest.raises(SmallFileError, match="larger than 1 bytes"):
        read_small_file(str(good), limit=1)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(SmallFileError, match="not a regular file"):  # and it did not block waiting for a writer
        read_small_file(str(fifo), limit=10)
    with pytest.raises(SmallFileError, match="not a regular file"):
        read_small_file("/dev/zero", limit=10)
    binary = tmp_path / "bin"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(SmallFileError, match="not UTF-8"):
        read_small_file(str(binary), limit=10)
    with pytest.raises(SmallFileError) as err:
        read_small_file(str(tmp_path / "absent"), limit=10)
    assert err.value.missing


# ---------------------------------------------------------------------------------------------------------------
# Values, and fuzzing what a platform (or a user's export) can put in the environment.


def test_value_parsers():
    assert parse_count("X", " 7 ", low=0, high=9, what="n") == 7
    assert parse_address("A", "fe80::1%eth0") == "fe80::1%eth0"
    assert parse_host_list("L", "a,b", ",") == ("a", "b")
    with pytest.raises(PlatformError, match="more than"):
        parse_host_list("L", ",".join(f"h{i}" for i in range(MAX_NODES + 1)), ",")


NAMES = ["PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NPROC_PER_NODE", "MASTER_ADDR",
         "MASTER_PORT", "WORLD_SIZE", "RANK", "NPROC_PER_NODE", "VC_TASK_INDEX", "VC_WORKER_HOSTS", "VC_MASTER_HOSTS",
         "LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX", "SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS",
         "SKYPILOT_NUM_NODES", "SKYPILOT_NUM_GPUS_PER_NODE", "JOB_COMPLETION_INDEX", "LOCAL_RANK", "PBS_JOBID",
         "LSB_JOBID", "LSB_MCPU_HOSTS", "SLURM_JOB_ID"]
VALUES = st.one_of(
    st.integers(min_value=-3, max_value=10**20).map(str),
    st.sampled_from(["", " ", "auto", "2:4", "4:2", ":", "a", "a,b", "a\nb", "hA 4 hB 2", "\u0663", "\u00b2", "0x10",
                     "1e3", "m-0.svc", "::1", "--x", "a b"]),
    st.text(max_size=12),
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=8))
def test_random_environments_give_a_detection_or_a_one_line_error(env):
    try:
        found = detect(env, no_files)
    except XrunError as err:
        assert err.exit_code == 2 and "\n" not in str(err)
        return
    if found is None:
        return
    assert platform_markers_present(env)  # the CLI skips detection without them
    assert "\n" not in found.announcement
    if found.num_nodes is not None:
        assert 1 <= found.num_nodes <= MAX_NODES
        if found.node_rank is not None:
            assert 0 <= found.node_rank < found.num_nodes
    if found.hosts and found.platform.pod:
        assert len(found.hosts) == found.num_nodes


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(["n1", "n2", "node-3.cluster", "", " n1 ", "a b", "x:y"]),
                          st.text(max_size=8)), max_size=20))
def test_random_node_files(lines):
    text = "\n".join(lines)
    try:
        hosts, slots = count_node_file(text, "NF")
    except HostfileError as err:
        assert err.exit_code == 2 and str(err).startswith("NF") and "\n" not in str(err)
        return
    assert sum(slots) == sum(1 for line in text.splitlines() if line.strip())
    assert len(set(hosts)) == len(hosts) and all(count >= 1 for count in slots)
