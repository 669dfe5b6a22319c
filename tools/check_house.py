#!/usr/bin/env python3
"""The house rules of issue 14 that a grep can hold (docs/architecture.md):

  - no non-test source file under src/ is over 800 lines (a file that grows past it is cut
    along its seams, as sandbox_service.cc and agent.cc were);
  - src/api never includes protocol/: it talks to the service, which alone talks to agents;
  - src/service names no route and includes nothing of HTTP: src/api renders its results;
  - the CLI links no agent code; the agent includes nothing of sbxd;
  - no file is read through std::istreambuf_iterator: libstdc++ throws from it when read(2)
    fails (ESRCH on a vanished /proc/<pid>), common/files.h reads without exceptions;
  - every descriptor is made close-on-exec in the call that makes it: sbxd and the agent fork
    and exec from many threads, and a descriptor opened without O_CLOEXEC leaks into whatever
    another thread starts meanwhile (a sandbox's process, QEMU, mke2fs). So each open, socket,
    pipe2, accept4, dup3, eventfd, memfd_create... names a *CLOEXEC flag in its arguments, dup
    becomes fcntl(F_DUPFD_CLOEXEC), fopen's mode has "e", and std::fstream (which cannot ask
    for it) is not used. libcurl and libnftables make theirs without it: curl_easy_init is
    called only by common/curl_init.h and nft_ctx_new only by net/nft.cc, which mark them. A
    call that must stay inheritable says so: `inheritable:` in a comment on its line or the
    two above.

Function length (~120 lines at most, table-like switches aside) needs a parser: `lizard -l cpp
src` checks it by hand. Exits 1 and names every breach; `--root` points at another tree (tests).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_tests import strip_cc  # noqa: E402  (comments and literals blanked, offsets kept)

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


# Calls that make a descriptor. A bare name preceded by an identifier, `&` or `*` is a
# declaration (`tcp::socket socket(ex)`), and a name qualified by anything but the global `::`
# is someone else's function.
_FD_CALL = re.compile(
    r'(?:(?<![\w:])::|std::|(?<![\w.>:$&*]))'
    r'(open|openat|open64|openat2|creat|socket|socketpair|accept|accept4|pipe|pipe2|'
    r'epoll_create|epoll_create1|eventfd|memfd_create|inotify_init|inotify_init1|'
    r'timerfd_create|signalfd|dup|dup3|fsopen|fsmount|open_tree|mkstemp|mkostemp|fopen|fdopen|'
    r'mnl_socket_open|curl_easy_init|nft_ctx_new)\s*\(')
# Libraries that make descriptors without asking: each is called in one place that marks them.
_WRAPPED = {"curl_easy_init": "src/common/curl_init.h", "nft_ctx_new": "src/net/nft.cc"}
_DECLARATOR = re.compile(r'[\w&*>]\s*$')
_FSTREAM = re.compile(r'std::(?:i|o)?fstream\b')


def _call_end(code: str, open_paren: int) -> int:
    depth = 0
    for j in range(open_paren, len(code)):
        if code[j] == "(":
            depth += 1
        elif code[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


def inheritable_descriptors(text: str, rel: str = "") -> list[tuple[int, str]]:
    """(line, call) of each descriptor made without close-on-exec in a source text (at `rel`,
    the path from the repository's root)."""
    code = strip_cc(text)
    lines = text.splitlines()
    found = []
    for m in _FD_CALL.finditer(code):
        name = m.group(1)
        qualified = code[m.start():m.start(1)].endswith("::")
        if not qualified and _DECLARATOR.search(code[:m.start()].rsplit("\n", 1)[-1]):
            before = code[:m.start()].rstrip()
            if not before.endswith("return"):
                continue
        end = _call_end(code, m.end() - 1)
        call = text[m.start(1):end]
        if code[m.end():end - 1].strip() == "" and name not in _WRAPPED and name != "inotify_init":
            continue  # a member or accessor of that name: those system calls take arguments
        if name in _WRAPPED:
            if rel == _WRAPPED[name]:
                continue
        elif name in ("fopen", "fdopen"):
            modes = re.findall(r'"([^"]*)"', call)
            if modes and "e" in modes[-1]:
                continue
        elif "CLOEXEC" in call and name not in ("dup", "pipe", "accept", "inotify_init",
                                                 "epoll_create", "creat", "mkstemp"):
            continue
        line = code.count("\n", 0, m.start()) + 1
        if any("inheritable:" in l for l in lines[max(0, line - 3):line]):
            continue
        found.append((line, " ".join(call.split())))
    for m in _FSTREAM.finditer(code):
        line = code.count("\n", 0, m.start()) + 1
        found.append((line, m.group(0)))
    return sorted(found)


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
        for n, call in inheritable_descriptors("\n".join(lines), rel.as_posix()):
            out.append(f"{rel}:{n}: {call} (the descriptor is inheritable: make it close-on-exec "
                       "in this call, or say `inheritable:` why not)")
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
