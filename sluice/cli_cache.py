"""`sluice cache`: list, remove or prune what sluice keeps in its cache folder.

    sluice cache [list]                 every entry, least recently used first
    sluice cache rm NAME [NAME ...]     remove entries by name
    sluice cache prune --max-bytes 8GiB remove converted models, oldest use first
    sluice cache clear                  remove everything

`--cache-dir` (default $SLUICE_CACHE_DIR, else ~/.cache/sluice) names the
folder; the layout is sluice/loader/model_cache.py's.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sluice.cli_flags import parse_size
from sluice.config import default_cache_dir
from sluice.errors import ModelLoadError
from sluice.loader import model_cache


def add_cache_command(commands: argparse._SubParsersAction) -> None:
    cache = commands.add_parser("cache", help="list or remove what sluice keeps in its cache")
    cache.add_argument(
        "--cache-dir", type=Path, default=None, help="the cache folder (default: sluice's)"
    )
    actions = cache.add_subparsers(dest="cache_action")
    actions.add_parser("list", help="every entry with its size and last use")
    remove = actions.add_parser("rm", help="remove entries by name")
    remove.add_argument("names", nargs="+", metavar="NAME")
    prune = actions.add_parser("prune", help="remove converted models, least recently used first")
    prune.add_argument("--max-bytes", type=parse_size, required=True, help="e.g. 8GiB")
    actions.add_parser("clear", help="remove every entry")


def run_cache_command(args: argparse.Namespace) -> int:
    cache_dir = args.cache_dir if args.cache_dir is not None else default_cache_dir()
    action = args.cache_action or "list"
    if action == "list":
        print(describe(model_cache.entries(cache_dir), cache_dir))
        return 0
    if action == "prune":
        removed = model_cache.prune(cache_dir, args.max_bytes)
    elif action == "clear":
        removed = model_cache.entries(cache_dir)
    else:
        by_name = {entry.name: entry for entry in model_cache.entries(cache_dir)}
        unknown = [name for name in args.names if name not in by_name]
        if unknown:
            raise ModelLoadError(f"no cache entry named {', '.join(unknown)} in {cache_dir}")
        removed = [by_name[name] for name in args.names]
    for entry in removed:
        if action != "prune":
            model_cache.remove(entry)
        print(f"removed {entry.name} ({_mib(entry.size_bytes)})")
    return 0


def describe(entries: list[model_cache.CacheEntry], cache_dir: Path) -> str:
    """The table `sluice cache list` prints."""
    if not entries:
        return f"{cache_dir}: empty"
    lines = [f"{cache_dir}:", f"{'NAME':<48} {'SIZE':>12}  LAST USED"]
    for entry in entries:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.last_used_s))
        kind = "" if entry.is_model else "  (support files)"
        lines.append(f"{entry.name:<48} {_mib(entry.size_bytes):>12}  {used}{kind}")
    total = sum(entry.size_bytes for entry in entries)
    lines.append(f"{'total':<48} {_mib(total):>12}")
    return "\n".join(lines)


def _mib(size_bytes: int) -> str:
    return f"{size_bytes / (1 << 20):.1f} MiB"
