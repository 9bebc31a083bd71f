"""The disk tier: atomic directory format, cross-process round trip, corruption, inspect CLI."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import _capsule_components as comps
import numpy as np
import pytest
import safetensors.torch

import rollcap.capsule.disk as tiers
from rollcap.capsule import (
    FORMAT_VERSION,
    Capsule,
    CapsuleMismatch,
    CorruptCapsule,
    add_subparser,
    format_manifest,
    inspect_main,
    load,
    open_disk,
    restore,
    save,
    snapshot,
)

HERE = Path(__file__).resolve().parent


def test_disk_round_trip_in_process(eager_world, tmp_path):
    """save -> load gives the same kinds, dtypes, bytes and digest; restore reproduces the next chunk."""
    cap = snapshot(eager_world, "disk", episode=1, chunk=2)
    expected_next = comps.run_chunk(eager_world, 2)
    on_disk = save(cap, tmp_path / "cap")
    assert on_disk.tier == "disk" and on_disk.state is None and on_disk.digest == cap.digest
    assert sorted(p.name for p in (tmp_path / "cap").iterdir()) == ["manifest.json", "tensors.safetensors"]
    back = load(tmp_path / "cap")
    assert back.tier == "host" and back.digest == cap.digest and back.boundary == cap.boundary
    for c in cap.components:
        for name, v in cap.state[c].items():
            w = back.state[c][name]
            assert type(w) is type(v) and w.dtype == v.dtype
    assert isinstance(back.state["sim"]["tick"], np.ndarray) and back.state["sim"]["tick"].dtype == np.int64
    comps.dirty(eager_world)
    restore(on_disk, eager_world)
    assert comps.run_chunk(eager_world, 2) == expected_next


def test_manifest_contents(eager_world, tmp_path):
    """The manifest records format version, boundary, fingerprints, per-buffer specs and digests, overall digest."""
    cap = snapshot(eager_world, "m", step=5)
    save(cap, tmp_path / "cap")
    m = json.loads((tmp_path / "cap" / "manifest.json").read_text())
    assert m["format_version"] == FORMAT_VERSION and m["digest"] == cap.digest and m["nbytes"] == cap.nbytes
    assert (
        m["boundary"]["step"] == 5
        and m["components"]["policy"]["fingerprint"]["backend"] == eager_world["policy"].backend
    )
    qpos = m["components"]["sim"]["buffers"]["qpos"]
    assert qpos["kind"] == "numpy" and qpos["dtype"] == "float64" and qpos["shape"] == [7] and qpos["nbytes"] == 56
    assert qpos["digest"] == cap.buffer_digests()["sim"]["qpos"]


@pytest.mark.slow
def test_disk_round_trip_across_processes(tmp_path):
    """A capsule written by another process restores here and the next chunks are byte-identical."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import _capsule_components as comps
        from rollcap.capsule import save, snapshot
        w = comps.make_world("jit")
        for k in range(3):
            comps.run_chunk(w, k)
        save(snapshot(w, "xproc", chunk=3), {str(tmp_path / "cap")!r})
        open({str(tmp_path / "next.bin")!r}, "wb").write(b"".join(comps.run_chunk(w, k) for k in (3, 4)))
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120, capture_output=True)
    w = comps.make_world("jit")  # fresh: zero buffers, initial sim
    restore(open_disk(tmp_path / "cap"), w)
    assert b"".join(comps.run_chunk(w, k) for k in (3, 4)) == (tmp_path / "next.bin").read_bytes()


# -- corruption ---------------------------------------------------------------------
def _edit_manifest(path: Path, fn) -> None:
    """Edit the manifest as a person or a damaged disk would: its manifest_digest no longer matches."""
    m = json.loads((path / "manifest.json").read_text())
    fn(m)
    (path / "manifest.json").write_text(json.dumps(m))


def _edit_sealed(path: Path, fn) -> None:
    """Edit the manifest and seal it again, to reach the checks behind the manifest_digest."""
    _edit_manifest(path, lambda m: (fn(m), m.update(manifest_digest=tiers._manifest_digest(m))))


def _truncate_tensors(p: Path) -> None:
    f = p / "tensors.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _flip_data_byte(p: Path) -> None:
    f = p / "tensors.safetensors"
    raw = bytearray(f.read_bytes())
    raw[-3] ^= 0x40
    f.write_bytes(bytes(raw))


def _drop_from_tensors(p: Path) -> None:
    f = p / "tensors.safetensors"
    with safetensors.safe_open(str(f), "pt") as h:
        meta, tensors = h.metadata(), {k: h.get_tensor(k) for k in h.keys() if k != "sim/qvel"}
    safetensors.torch.save_file(tensors, str(f), metadata=meta)


def _set_shape(m: dict) -> None:
    """in.x float32[4, 8] -> [4, 9], nbytes kept consistent."""
    m["components"]["policy"]["buffers"]["in.x"].update(shape=[4, 9], nbytes=144)
    m["nbytes"] += 16


def _drop_qvel(m: dict) -> None:
    m["nbytes"] -= m["components"]["sim"]["buffers"].pop("qvel")["nbytes"]


CORRUPTIONS = {
    "truncated tensors": (_truncate_tensors, CorruptCapsule, "tensors.safetensors is damaged"),
    "flipped data byte": (_flip_data_byte, CorruptCapsule, "do not match their digest"),
    "manifest edited": (
        lambda p: _edit_manifest(p, lambda m: m["boundary"].update(label="other")),
        CorruptCapsule,
        "does not match its manifest_digest",
    ),
    "manifest shape edited": (
        lambda p: _edit_sealed(p, _set_shape),
        CorruptCapsule,
        r"in\.x: manifest says float32\[4, 9\], tensors.safetensors holds float32\[4, 8\]",
    ),
    "manifest truncated": (
        lambda p: (p / "manifest.json").write_text((p / "manifest.json").read_text()[:200]),
        CorruptCapsule,
        "not valid JSON",
    ),
    "manifest not an object": (lambda p: (p / "manifest.json").write_text("[]"), CorruptCapsule, "malformed"),
    "manifest field missing": (
        lambda p: _edit_sealed(p, lambda m: m.pop("digest")),
        CorruptCapsule,
        "missing field 'digest'",
    ),
    "newer format": (
        lambda p: _edit_sealed(p, lambda m: m.update(format_version=99)),
        CorruptCapsule,
        "upgrade rollcap",
    ),
    "format 1": (
        lambda p: _edit_sealed(p, lambda m: m.update(format_version=1)),
        CorruptCapsule,
        "format_version 1 was written before manifests were sealed",
    ),
    "buffer missing from manifest": (lambda p: _edit_sealed(p, _drop_qvel), CorruptCapsule, "does not list"),
    "buffer missing from tensors": (_drop_from_tensors, CorruptCapsule, r"sim\.qvel .* lacks it"),
    "tensors file missing": (
        lambda p: (p / "tensors.safetensors").unlink(),
        CorruptCapsule,
        "tensors.safetensors is missing",
    ),
    "manifest missing": (lambda p: (p / "manifest.json").unlink(), CorruptCapsule, "manifest.json is missing"),
    "digest edited": (
        lambda p: _edit_sealed(p, lambda m: m.update(digest="sha256:" + "0" * 64)),
        CorruptCapsule,
        "belongs to capsule",
    ),
    "fingerprint edited": (
        lambda p: _edit_manifest(p, lambda m: m["components"]["policy"]["fingerprint"].update(weights="sha256:other")),
        CorruptCapsule,
        "does not match its manifest_digest",
    ),
    "another deployment's capsule": (
        lambda p: _edit_sealed(p, lambda m: m["components"]["policy"]["fingerprint"].update(weights="sha256:other")),
        CapsuleMismatch,
        "fingerprint field 'weights' differs",
    ),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corrupt_disk_capsule_refused_live_untouched(eager_world, tmp_path, case):
    """Each kind of damage raises its named one-line error and leaves every live buffer as it was."""
    mutate, error, match = CORRUPTIONS[case]
    on_disk = save(snapshot(eager_world, "c"), tmp_path / "cap")
    comps.dirty(eager_world)
    live = comps.state_bytes(eager_world)
    mutate(tmp_path / "cap")
    expect_digest = None if case in ("digest edited", "newer format", "format 1") else on_disk.digest
    with pytest.raises(error, match=match) as info:
        restore(open_disk(tmp_path / "cap") if expect_digest is None else on_disk, eager_world)
    assert "\n" not in str(info.value)
    assert comps.state_bytes(eager_world) == live


def _buffer(m: dict, name: str = "in.x") -> dict:
    return m["components"]["policy"]["buffers"][name]


MANIFEST_EDITS = {
    "fingerprint backend": lambda m: m["components"]["policy"]["fingerprint"].update(backend="cuda"),
    "fingerprint weights_digest": lambda m: m["components"]["policy"]["fingerprint"].update(
        weights="sha256:" + "1" * 64
    ),
    "fingerprint field added": lambda m: m["components"]["policy"]["fingerprint"].update(dtype="float16"),
    "fingerprint device": lambda m: m["components"]["policy"]["fingerprint"].update(device_kind="cuda"),
    "buffer dtype": lambda m: _buffer(m).update(dtype="float64"),
    "buffer device": lambda m: _buffer(m).update(device="cuda:0"),
    "buffer nbytes": lambda m: _buffer(m).update(nbytes=10**30),
    "buffer key": lambda m: _buffer(m).update(key="policy/in.noise"),
    "buffer digest": lambda m: _buffer(m).update(digest=_buffer(m, "in.noise")["digest"]),
    "boundary label": lambda m: m["boundary"].update(label="elsewhere"),
    "boundary episode": lambda m: m["boundary"].update(episode=99),
    "boundary extra": lambda m: m["boundary"].update(extra={"note": "added"}),
    "negative wall_time": lambda m: m["boundary"].update(wall_time=-5.0),
    "huge wall_time": lambda m: m["boundary"].update(wall_time=1e300),
    "total nbytes": lambda m: m.update(nbytes=10**30),
    "writer": lambda m: m["writer"].update(torch="0.0"),
    "seal removed": lambda m: m.pop("manifest_digest"),
}


@pytest.mark.parametrize("edit", list(MANIFEST_EDITS))
def test_every_manifest_edit_is_refused(eager_world, tmp_path, capsys, edit):
    """Whatever field of the manifest is edited, inspect and restore refuse it in one line (nothing is 'digest OK')."""
    save(snapshot(eager_world, "sealed", episode=3), tmp_path / "cap")
    _edit_manifest(tmp_path / "cap", MANIFEST_EDITS[edit])
    before = {f.name: f.read_bytes() for f in (tmp_path / "cap").iterdir()}
    assert inspect_main([str(tmp_path / "cap")]) == 2
    out, err = capsys.readouterr()
    assert (
        out == "" and len(err.strip().splitlines()) == 1 and "manifest_digest" in err and str(tmp_path / "cap") in err
    )
    live = comps.state_bytes(eager_world)
    with pytest.raises(CorruptCapsule, match="manifest_digest"):
        restore(open_disk(tmp_path / "cap"), eager_world)
    assert comps.state_bytes(eager_world) == live
    assert {f.name: f.read_bytes() for f in (tmp_path / "cap").iterdir()} == before


@pytest.mark.parametrize(
    "field,value", [("nbytes", 10**30), ("wall_time", -5.0), ("dtype", "float128"), ("device", "warp:9")]
)
def test_sealed_but_impossible_manifest_is_refused(eager_world, tmp_path, field, value):
    """A manifest sealed again after an edit still has to make sense: sizes, times, dtypes, devices."""
    save(snapshot(eager_world, "x"), tmp_path / "cap")
    edit = {
        "nbytes": lambda m: m.update(nbytes=value),
        "wall_time": lambda m: m["boundary"].update(wall_time=value),
    }.get(field, lambda m: _buffer(m).update({field: value}))
    _edit_sealed(tmp_path / "cap", edit)
    with pytest.raises(CorruptCapsule, match=f"{tmp_path / 'cap'}: manifest.json is malformed") as info:
        load(tmp_path / "cap")
    assert "\n" not in str(info.value)


def test_inspect_shows_a_wall_time_past_any_calendar(eager_world, tmp_path, capsys):
    """A boundary time no calendar holds (1e300 s) is printed as a number, no traceback."""
    cap = snapshot(eager_world, "far")
    far = Capsule(dataclasses.replace(cap.boundary, wall_time=1e300), cap.specs, cap.fingerprints, cap.tier, cap.state)
    save(far, tmp_path / "cap")
    assert inspect_main([str(tmp_path / "cap")]) == 0
    assert "wall_time=1e+300 s (past any calendar date)" in capsys.readouterr().out


def test_missing_directory_and_replaced_directory(eager_world, tmp_path):
    """No directory at all, or a directory replaced by another capsule, is refused."""
    with pytest.raises(CorruptCapsule, match="no capsule directory"):
        load(tmp_path / "nowhere")
    first = save(snapshot(eager_world, "one"), tmp_path / "cap")
    comps.run_chunk(eager_world, 7)
    save(snapshot(eager_world, "two"), tmp_path / "cap", overwrite=True)
    live = comps.state_bytes(eager_world)
    with pytest.raises(CorruptCapsule, match="replaced"):
        restore(first, eager_world)
    assert comps.state_bytes(eager_world) == live


# -- atomic writes ------------------------------------------------------------------
def test_save_refuses_to_clobber_and_overwrites_cleanly(eager_world, tmp_path):
    """An existing capsule is kept unless overwrite=True; no temporary siblings remain."""
    save(snapshot(eager_world, "a"), tmp_path / "cap")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save(snapshot(eager_world, "b"), tmp_path / "cap")
    assert load(tmp_path / "cap").label == "a"
    save(snapshot(eager_world, "b"), tmp_path / "cap", overwrite=True)
    assert load(tmp_path / "cap").label == "b"
    assert sorted(os.listdir(tmp_path)) == ["cap"]


@pytest.mark.parametrize("where", ["tensors", "before-rename"])
def test_crash_mid_write_leaves_no_capsule(eager_world, tmp_path, monkeypatch, where):
    """A failure while writing leaves neither a capsule nor a temporary directory behind."""

    def boom(*a, **k):
        raise OSError("disk full (simulated)")

    if where == "tensors":
        monkeypatch.setattr(safetensors.torch, "save_file", boom)
    else:
        monkeypatch.setattr(tiers, "fsync_dir", boom)
    with pytest.raises(OSError, match="simulated"):
        save(snapshot(eager_world, "x"), tmp_path / "cap")
    assert os.listdir(tmp_path) == []


# -- inspect CLI ----------------------------------------------------------------------
def test_format_manifest_lists_everything(eager_world, tmp_path):
    """The report names components, buffers with dtype/shape/bytes, fingerprint fields and digest OK."""
    cap = snapshot(eager_world, "show", episode=2)
    save(cap, tmp_path / "cap")
    text = format_manifest(str(tmp_path / "cap"))
    assert f"{cap.digest}  OK" in text and "label='show' episode=2" in text
    assert "component policy" in text and "component sim" in text and "backend:" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("qpos"))
    assert "float64" in line and "[7]" in line and "56 B" in line and "numpy" in line


def test_inspect_exit_codes(eager_world, tmp_path, capsys):
    """0 for a good capsule; 2 and one stderr line (no traceback) for a corrupt or missing one."""
    save(snapshot(eager_world, "i"), tmp_path / "cap")
    assert inspect_main([str(tmp_path / "cap")]) == 0
    assert "OK" in capsys.readouterr().out
    _flip_data_byte(tmp_path / "cap")
    assert inspect_main([str(tmp_path / "cap")]) == 2
    captured = capsys.readouterr()
    assert "FAILED" in captured.out and len(captured.err.strip().splitlines()) == 1
    assert inspect_main([str(tmp_path / "missing")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and "Traceback" not in captured.err


def test_add_subparser_registers_capsule_inspect(eager_world, tmp_path, capsys):
    """``rollcap capsule inspect PATH`` parses through add_subparser and its handler returns the exit code."""
    save(snapshot(eager_world, "p"), tmp_path / "cap")
    parser = argparse.ArgumentParser(prog="rollcap")
    add_subparser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["capsule", "inspect", str(tmp_path / "cap")])
    assert args.func(args) == 0
    assert "component policy" in capsys.readouterr().out
    nested = argparse.ArgumentParser(prog="rollcap")  # rollout/cli.py makes `capsule` itself
    capsule = nested.add_subparsers(dest="command").add_parser("capsule")
    add_subparser(capsule.add_subparsers(dest="capsule_command"))
    args = nested.parse_args(["capsule", "inspect", str(tmp_path / "missing")])
    assert args.func(args) == 2 and "no capsule directory" in capsys.readouterr().err
