"""``rollcap merge RUN``: a sharded run (recorded by actors, one shard each) made into the single-file layout."""

from __future__ import annotations

from pathlib import Path

DESCRIPTION = (
    "Consolidate a sharded run (rollcap run --actors N writes one shard per actor and a manifest.jsonl) into one "
    "episodes/ directory and one episodes.hdf5, in index order, digests checked; the manifest and the shards are "
    "removed only once the merged files read back equal. Every command reads a sharded run as it is: merge only "
    "for tools that expect one file. Interrupted, run it again. A run recorded with --shard-dir DIR (no shared "
    "filesystem) has its shards under DIR/<run name>/ on each node: copy them back to that path on this machine, "
    "or into one directory named by --from (the shard names never repeat across nodes). Shards outside RUN are left as they are."
)
EXAMPLE = "rollcap merge runs/eval --from /scratch/collected/eval"


def add_parser(command) -> None:
    """Register ``merge`` through the main CLI's ``command(name, func, help, description, example)``."""
    p = command(
        "merge",
        cmd_merge,
        "make a sharded run (from --actors) one episodes.hdf5 and one episodes/",
        DESCRIPTION,
        EXAMPLE,
    )
    p.add_argument("run", type=Path, metavar="RUN_DIR", help="the run directory holding manifest.jsonl")
    p.add_argument(
        "--from",
        dest="search",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a directory holding shards copied back from their nodes (sNNN/ as --shard-dir wrote them); repeatable; looked in after the manifest's path and RUN_DIR/shards",
    )


def cmd_merge(args) -> int:
    from rollcap.rollout.recording.shards import merge

    n = merge(args.run, search=args.search)
    print(f"merged {n} episode(s) into {args.run / 'episodes'} and {args.run / 'episodes.hdf5'}")
    return 0
