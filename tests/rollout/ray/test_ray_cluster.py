"""A two-node Ray cluster on this machine: `address` joins it, actors on both nodes, the driver records the local run's episodes."""

from __future__ import annotations

from pathlib import Path

import pytest

import rollcap
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.recording import episode_digest, h5_indices
from rollcap.rollout.recording.shards import read_manifest
from tests.rollout.ray._cluster import two_node_cluster
from tests.rollout._tiny import ENV_KW

pytestmark = pytest.mark.slow


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """A head node and a worker node with one CPU each (so two actors land on two nodes).

    Started as the README says to start a head: with gRPC's fork handlers off, without which the
    head's Ray Client proxy lost the server it forks for a client (a CI run: "Initialization failure
    from server ... zombie").
    """
    pytest.importorskip("ray")
    port = _free_port()
    with two_node_cluster(ray_client_server_port=port) as c:
        c.client_address = f"ray://127.0.0.1:{port}"  # the head's Ray Client server
        yield c


def test_a_two_node_cluster_records_the_local_run_s_episodes_sharded_or_by_the_driver(cluster, ckpt, tmp_path):
    """8 episodes through address=<the cluster>, actors on 2 nodes: sharded (one shard per actor, a manifest) and recorded by the driver
    (one file), both with the in-process run's digests."""
    names = {
        "policy": Path(ckpt[ckpt.index("--policy") + 1]),
        "critic": Path(ckpt[ckpt.index("--critic") + 1]),
        "env_kwargs": ENV_KW,
        "progress": False,
        "seed": 3,
        "max_chunks": 5,
    }
    local = rollcap.run(8, out=tmp_path / "local", **names)
    want = {r.index: episode_digest(r) for r in rollcap.load(local.run_dir)}
    sharded = rollcap.run(8, out=tmp_path / "sharded", actors=2, address=cluster.address, **names)
    assert (
        sharded.summary["actors"],
        sharded.summary["nodes"],
        sharded.summary["shards"],
        sharded.summary["address"],
    ) == (2, 2, 2, cluster.address)
    entries = read_manifest(sharded.run_dir)[1]
    assert sorted(entries) == list(range(8)) and len({e.node for e in entries.values()}) == 2
    assert {r.index: episode_digest(r) for r in rollcap.load(sharded.run_dir)} == want
    remote = rollcap.run(8, out=tmp_path / "cluster", actors=2, address=cluster.address, shards=False, **names)
    assert (remote.summary["actors"], remote.summary["nodes"], remote.summary["address"]) == (2, 2, cluster.address)
    assert {r.index: episode_digest(r) for r in rollcap.load(remote.run_dir)} == want
    assert sorted(p.name for p in (remote.run_dir / "episodes").glob("*.npz")) == [
        f"episode_{i:05d}.npz" for i in range(8)
    ]
    assert h5_indices(remote.run_dir / "episodes.hdf5") == list(range(8))


def test_a_ray_client_address_runs_the_same_episodes(cluster, ckpt, tmp_path):
    """address='ray://…' (Ray Client, the head's client server): the driver is a client, the actors run on the cluster; digests equal an in-process run's."""
    pytest.importorskip("grpc")  # Ray Client needs ray[client]
    names = {
        "policy": Path(ckpt[ckpt.index("--policy") + 1]),
        "critic": Path(ckpt[ckpt.index("--critic") + 1]),
        "env_kwargs": ENV_KW,
        "progress": False,
        "seed": 5,
        "max_chunks": 4,
    }
    local = rollcap.run(4, out=tmp_path / "local", **names)
    address = cluster.client_address
    remote = rollcap.run(4, out=tmp_path / "client", actors=2, address=address, **names)
    assert remote.summary["address"] == address and remote.summary["failed"] == {}
    assert {r.index: episode_digest(r) for r in rollcap.load(remote.run_dir)} == {
        r.index: episode_digest(r) for r in rollcap.load(local.run_dir)
    }


def test_branches_on_the_cluster_equal_the_in_process_branches(cluster, ckpt, tmp_path):
    """rollcap.branch(actors=2, address=<the cluster>): the branches' digests equal in-process branching; recordings in the driver's out."""
    from rollcap.rollout.spec import Parts

    names = {"policy": Path(ckpt[ckpt.index("--policy") + 1]), "critic": Path(ckpt[ckpt.index("--critic") + 1])}
    parent = rollcap.run(1, out=tmp_path / "run", env_kwargs=ENV_KW, progress=False, seed=7, max_chunks=5, **names)
    local, _ = rollcap.branch(parent.run_dir / "episodes.hdf5", 0, 2, 3, out=tmp_path / "local", parts=Parts(**names))
    remote, summary = rollcap.branch(
        parent.run_dir / "episodes.hdf5",
        0,
        2,
        3,
        out=tmp_path / "cluster",
        parts=Parts(**names),
        actors=2,
        address=cluster.address,
    )
    assert summary["control"] == "exact" and len(remote.records) == 4
    assert [episode_digest(r) for r in remote.records] == [episode_digest(r) for r in local.records]
    assert h5_indices(tmp_path / "cluster" / "episodes.hdf5") == list(range(4))


def test_branch_address_without_actors_is_refused(ckpt, tmp_path):
    """--address alone is a one-line error naming it; nothing is created."""
    with pytest.raises(ValueError, match="--address: needs --actors"):
        rollcap.branch(tmp_path / "missing.hdf5", 0, 1, 1, out=tmp_path / "x", address="auto")
    assert not (tmp_path / "x").exists()


def test_an_address_nothing_answers_at_is_one_config_error_and_creates_nothing(ckpt, tmp_path):
    """host:port and ray://host:port with no listener: refused at once (Ray itself retried for minutes), no run directory."""
    pytest.importorskip("ray")
    names = {
        "policy": Path(ckpt[ckpt.index("--policy") + 1]),
        "critic": Path(ckpt[ckpt.index("--critic") + 1]),
        "env_kwargs": ENV_KW,
        "progress": False,
    }
    port = _free_port()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(ConfigError, match=f"nothing answers at 127.0.0.1:{port}") as err:
            rollcap.run(2, out=tmp_path / "run", actors=2, address=address, **names)
        assert err.value.field == "address"
        assert not (tmp_path / "run").exists()


def test_a_failed_connection_leaves_ray_usable_in_the_process(cluster, monkeypatch):
    """ray:// at the GCS port (a server, not a Ray Client one): one ConfigError; the same process then joins the cluster.

    Before, the half-made client connection made the next ``ray.init`` fail on an assertion inside Ray.
    """
    import ray
    from ray.util.client import worker

    from rollcap.rollout.ray.connect import connect

    monkeypatch.setattr(worker, "INITIAL_TIMEOUT_SEC", 1)  # Ray Client's first wait (5 s, doubling, three tries)
    with (
        pytest.raises(ConfigError, match=f"could not join the Ray cluster at ray://{cluster.address}"),
        pytest.warns(UserWarning, match="Ray Client connection timed out"),
    ):
        connect("ray://" + cluster.address)
    assert not ray.is_initialized()
    try:
        assert connect(cluster.address) is True
        assert ray.get(ray.put(7)) == 7
    finally:
        ray.shutdown()


def test_per_node_shard_dirs_are_named_in_the_manifest_and_merged_back_from_where_they_were_copied(
    cluster, ckpt, tmp_path, capsys
):
    """shard_dir=<nodes>: each actor writes <nodes>/<run name>/sNNN (absolute, named in the manifest with its node; nothing under the run dir's
    shards/). Moved away as if on other nodes, then collected into one directory: merge without it is one line naming the episode, its node
    and each place looked; with `--from` and one shard missing, the line names that shard's first episode; with every shard, the merged run
    has the in-process run's digests."""
    import shutil

    from rollcap.rollout.cli import main

    names = {
        "policy": Path(ckpt[ckpt.index("--policy") + 1]),
        "critic": Path(ckpt[ckpt.index("--critic") + 1]),
        "env_kwargs": ENV_KW,
        "progress": False,
        "seed": 6,
        "max_chunks": 4,
    }
    local = rollcap.run(6, out=tmp_path / "local", **names)
    want = {r.index: episode_digest(r) for r in rollcap.load(local.run_dir)}
    nodes, run_dir = tmp_path / "nodes", tmp_path / "run"
    result = rollcap.run(6, out=run_dir, actors=2, address=cluster.address, shard_dir=nodes, **names)
    entries = read_manifest(run_dir)[1]
    shards = sorted({e.shard for e in entries.values()})
    assert (
        shards == [str(nodes / "run" / f"s{i:03d}") for i in range(2)] and len({e.node for e in entries.values()}) == 2
    ), entries
    assert result.summary["shards"] == 2 and not (run_dir / "shards").exists()
    assert {r.index: episode_digest(r) for r in rollcap.load(run_dir)} == want  # read where they were written

    back = tmp_path / "back"  # the nodes' shards, collected into one directory; none left where the manifest says
    shutil.move(str(nodes / "run"), str(back))
    first = {s: min(i for i, e in entries.items() if e.shard == s) for s in shards}
    assert main(["merge", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    e0 = entries[0]
    assert err == [
        f"rollcap merge: error: episode 0: its shard {e0.shard} (written on node {e0.node}) is not here: looked in {e0.shard}, {run_dir / 'shards' / Path(e0.shard).name}; copy it back from that node"
    ], err
    missing = Path(shards[1]).name
    shutil.move(str(back / missing), str(tmp_path / "aside"))
    assert main(["merge", str(run_dir), "--from", str(back)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and err[0].startswith(f"rollcap merge: error: episode {first[shards[1]]}: its shard {shards[1]} ")
        and str(back / missing) in err[0]
    ), err
    assert (run_dir / "manifest.jsonl").is_file()  # nothing merged away
    shutil.move(str(tmp_path / "aside"), str(back / missing))
    assert main(["merge", str(run_dir), "--from", str(back)]) == 0
    assert not (run_dir / "manifest.jsonl").exists() and h5_indices(run_dir / "episodes.hdf5") == list(range(6))
    assert {r.index: episode_digest(r) for r in rollcap.load(run_dir)} == want


def test_a_shard_dir_without_sharded_actors_is_refused(ckpt, tmp_path):
    """shard_dir with no actors, or with shards=False: one ConfigError naming it; nothing is created."""
    names = {
        "policy": Path(ckpt[ckpt.index("--policy") + 1]),
        "critic": Path(ckpt[ckpt.index("--critic") + 1]),
        "env_kwargs": ENV_KW,
        "progress": False,
    }
    for kw in ({}, {"actors": 2, "shards": False}):
        with pytest.raises(
            ConfigError, match="per-node shard directories are for runs on actors that record shards"
        ) as err:
            rollcap.run(2, out=tmp_path / "run", shard_dir=tmp_path / "nodes", **kw, **names)
        assert err.value.field == "shard_dir"
        assert not (tmp_path / "run").exists() and not (tmp_path / "nodes").exists()
