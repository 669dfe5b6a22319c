#!/usr/bin/env python3
"""The house rules of issue 14 that a grep can hold (docs/architecture.md):

  - no non-test source file under src/ is over 800 lines (a file that grows past it is cut
    along its seams, as sandbox_service.cc and agent.cc were);
  - src/api never includes protocol/: it talks to the service, which alone talks to agents;
  - src/service names no route and includes nothing of HTTP: src/api renders its results;
  - the CLI links no agent code; the agent includes nothing of sbxd;
  - no file is read through std::istreambuf_iterator: libstdc++ throws from it when read(2)
    fails (ESRCH on a vanished /proc/<pid>), common/files.h reads without exceptions.

Function length (~120 lines at most, table-like switches aside) needs a parser: `lizard -l cpp
src` checks it by hand. Exits 1 and names every breach; `--root` points at another tree (tests).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

MAX_LINES = 800
SOURCE_SUFFIXES = {".cc", ".h"}

# (folder under src/, pattern a line may not match, why)
FORBIDDEN = [
    ("api", re.compile(r'#\s*include\s+"protocol/'),
     "src/api talks to the service, never to the agent protocol"),
    ("service", re.compile(r'"/v1'), "src/service knows no routes (src/api/routes.cc does)"),
    ("service", re.compile(r'#\s*include\s+[<"](boost/beast|http/)'),
     "src/service knows nothing of HTTP (src/api renders its results)"),
    ("cli", re.compile(r'#\s*include\s+"agent/'), "the CLI links no agent code (src/archive is shared)"),
    ("agent", re.compile(r'#\s*include\s+"(service|api|http|store|daemon)/'),
     "the agent includes nothing of sbxd"),
    ("*", re.compile(r'std::istreambuf_iterator<'),
     "it throws when read(2) fails: use common/files.h"),
]


def is_test(path: Path) -> bool:
    return path.stem.endswith("_test") or path.stem.endswith("_test_util") or path.name == "test_util.h"


def problems(root: Path) -> list[str]:
    src = root / "src"
    out: list[str] = []
    for path in sorted(src.rglob("*")):
        if path.suffix not in SOURCE_SUFFIXES or not path.is_file() or is_test(path):
            continue
        rel = path.relative_to(root)
        lines = path.read_text(errors="replace").splitlines()
        if len(lines) > MAX_LINES:
            out.append(f"{rel}: {len(lines)} lines (at most {MAX_LINES}: cut it along its seams)")
        folder = path.relative_to(src).parts[0]
        for top, pattern, why in FORBIDDEN:
            if top not in ("*", folder):
                continue
            for n, line in enumerate(lines, 1):
                if pattern.search(line):
                    out.append(f"{rel}:{n}: {line.strip()} ({why})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = ap.parse_args()
    found = problems(args.root)
    for p in found:
        print(f"check_house: {p}", file=sys.stderr)
    if found:
        return 1
    print(f"check_house: {args.root / 'src'} keeps the house rules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
