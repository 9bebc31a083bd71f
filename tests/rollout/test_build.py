"""One spec, one build: the runners are made in rollout/build.py only; a spec probes nothing; byte_fields lists the settings bits depend on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from rollcap.rollout.spec import Parts, RunConfig, Spec, byte_fields, flag_of
from rollcap.rollout.build import build, probe
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
RUNNERS = {"PolicyRunner", "CriticRunner", "RTCPolicyRunner", "FlowSDERunner"}


def _runner_calls(path: Path) -> list[str]:
    """``file:line name`` of every call of a runner class in ``path`` (``PolicyRunner(...)``, ``x.CriticRunner(...)``, an alias)."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = set(RUNNERS)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            aliases |= {a.asname for a in node.names if a.name in RUNNERS and a.asname}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in aliases:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return found


def test_only_the_build_module_constructs_runners():
    """Every entry point builds through rollcap.rollout.build (its policy_runner / critic_runner); a second build path fails here."""
    calls = [
        c
        for p in sorted((ROOT / "rollout").rglob("*.py"))
        if p != ROOT / "rollout" / "build.py"
        for c in _runner_calls(p)
    ]
    assert not calls, (
        "runners constructed outside rollout/build.py (call build.runners / policy_runner):\n" + "\n".join(calls)
    )
    tree = ast.parse((ROOT / "rollout" / "build.py").read_text())
    names = {
        n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(tree) if isinstance(n, (ast.Name, ast.Attribute))
    }
    assert RUNNERS <= names, "rollout/build.py no longer makes the runners"  # (policies.PolicyRunner: an attribute)


def test_the_scan_sees_a_constructor_call(tmp_path):
    bad = ROOT / "rollout" / "_scan_probe_tmp.py"
    try:
        bad.write_text("from rollcap.policies import PolicyRunner as P\n\nr = P(None)\n")
        assert _runner_calls(bad) == ["rollout/_scan_probe_tmp.py:3 P"]
    finally:
        bad.unlink()


def test_a_spec_probes_nothing_the_build_does():
    """Naming a CUDA device this machine lacks is a spec; building from it is one line naming --device."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    parts = Parts(device=f"cuda:{count}")  # one past the last visible device: never here
    with pytest.raises(ConfigError, match=r"device: 'cuda:\d+' is not available here"):
        probe(parts)
    with pytest.raises(ConfigError, match="is not available here"):
        build(Spec(parts, HostConfig(), RunConfig(episodes=1)), check_env=False)


def test_byte_fields_name_what_an_episode_depends_on():
    fields = dict(byte_fields())
    assert {
        f: fields.get(f) for f in ("env_id", "policy", "precision", "sampler", "seed", "max_chunks", "envs", "graphs")
    } == {
        "env_id": "deployment",
        "policy": "deployment",
        "precision": "deployment",
        "sampler": "deployment",
        "seed": "host",
        "max_chunks": "host",
        "envs": "run",
        "graphs": "run",
    }
    assert not {"episodes", "out", "progress", "writers", "actors", "resume"} & set(fields)
    assert (flag_of("env_id"), flag_of("formats"), flag_of("max_chunks")) == ("--env", "--format", "--max-chunks")


def test_spec_of_is_what_run_takes():
    spec = Spec.of(3, "runs/x", "rollcap/PushBlock-v0", None, "none", seed=4, envs=2, precision="bf16")
    assert (spec.run.episodes, spec.host.seed, spec.run.envs, spec.deployment.precision, spec.deployment.critic) == (
        3,
        4,
        2,
        "bf16",
        None,
    )
    with pytest.raises(TypeError, match="unexpected option"):
        Spec.of(1, nonsense=1)


def test_a_spec_holds_names_or_objects_by_one_rule_and_probes_nothing(tmp_path):
    """The env, policy and critic are names (str or a path) or objects held as they are; a LeRobot directory and the
    cores for env_workers=auto are looked at where the spec is built, with the same one-line messages."""
    from rollcap.rollout.build import for_this_machine
    from rollcap.rollout.named import ExpertPolicy
    from rollcap.rollout.spec import auto_env_workers, is_name

    assert is_name("rollcap/PushBlock-v0") and is_name(tmp_path) and not is_name(None) and not is_name(ExpertPolicy())
    mine = ExpertPolicy()
    spec = Spec.of(2, env="rollcap/PushBlock-v0", policy=mine)
    assert spec.deployment.policy is mine and spec.deployment.critic is None and not spec.deployment.names_only
    with pytest.raises(ConfigError, match="a policy object runs as it is") as info:
        Spec.of(2, policy=mine, precision="bf16")
    assert info.value.field == "precision"
    lerobot = Parts(policy=f"lerobot:{tmp_path / 'nothing'}", critic="none")  # made: nothing looked at
    with pytest.raises(ConfigError, match="holds no config.json") as info:
        probe(lerobot)
    assert info.value.field == "policy"
    auto = Spec.of(1, envs=8, env_workers="auto")
    assert auto.run.env_workers == "auto"
    assert for_this_machine(auto).run.env_workers == auto_env_workers(8)
    assert for_this_machine(Spec.of(1, envs=8, env_workers="auto", writers=1)).run.env_workers == 0


def test_one_precision_rule_for_spec_and_graph():
    """The compiled CPU plans are fp32 only: the spec's message (naming --precision) is the graph's, without the label."""
    from rollcap.kernels.precision import check_plan_precision

    with pytest.raises(ValueError) as graph:
        check_plan_precision("bf16", "aoti")
    with pytest.raises(ConfigError) as spec:
        Parts(backend="aoti", precision="bf16")
    assert (spec.value.field, spec.value.problem) == ("precision", str(graph.value))


def test_build_returns_lists_at_any_batch():
    """Built holds lists whatever the batch: one policy runner at batch 1, G at N/G, a critic runner per policy runner
    or none, and a policy object of yours alone (the build closes only what it made)."""
    from rollcap.rollout.named import ExpertPolicy

    cases = [
        (Spec.of(1), 1, 1, 1),
        (Spec.of(1, envs=4, graphs=2), 4, 2, 2),
        (Spec.of(1, envs=2, critic="none"), 2, 1, 0),
        (Spec.of(1, policy=ExpertPolicy(), critic="none"), 1, 1, 0),
    ]
    for spec, envs, policies, critics in cases:
        built = build(spec, check_env=False)
        try:
            assert (len(built.envs), len(built.policies), len(built.critics)) == (envs, policies, critics), spec
            assert {getattr(p, "batch", 1) for p in built.policies} == {envs // policies}
        finally:
            built.close()
    assert built.policies[0] is spec.deployment.policy and built.policies[0] not in built.own
