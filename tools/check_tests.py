#!/usr/bin/env python3
"""Checks that the test suite cannot shrink or skip without anyone noticing (issue 13).

1. Orphans. Every `*_test.cc` under src/, tests/ and bench/ must be a source of a test target:
   an `sbx_cc_test(... SRCS ...)`, or an `add_executable` whose target an `add_test` runs or
   `gtest_discover_tests` registers. Every `*_test.py` / `*_test.sh` under tools/ and bench/
   must be named by an `add_test`. A merge once dropped the sbx_cc_test line of
   src/common/metrics_test.cc and its 19 tests went unbuilt and unrun for weeks.
   With --build-dir, the configured build is checked as well (this is what the ctest test
   `check_tests` does): build.ninja must compile each `*_test.cc` into a target, and ctest must
   list at least one test that runs that target's binary, so a condition that is false in
   this configuration (`if(TARGET ...)`) or a gtest binary with no tests also shows.
2. Raw skips. A skip must go through the helpers that honour SBX_TESTS_MUST_RUN=1
   (src/common/test_util.h: SBX_SKIP_OR_FAIL, SBX_SKIP_NOT_APPLICABLE; tests/e2e/conftest.py:
   skip_or_fail, not_applicable_on_fake_runtime, ns_runtime_only,
   not_run_without_optional_component). Anywhere else under src/,
   tests/ and bench/, these fail the check: GTEST_SKIP, a DISABLED_ gtest, pytest.skip,
   pytest.mark.skip / skipif / xfail, pytest.importorskip, unittest's skip decorators,
   skipTest and SkipTest.

Usage: python3 tools/check_tests.py [--root DIR] [--build-dir DIR]
Exits 1 naming every problem; Python 3.11 standard library only.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

CC_TEST_ROOTS = ("src", "tests", "bench")
SCRIPT_TEST_ROOTS = ("tools", "bench")
LINT_ROOTS = ("src", "tests", "bench")
SKIP_DIR_NAMES = {".git", "__pycache__", "node_modules"}

# Where a raw skip is allowed: the helpers themselves (file -> helper names).
CC_HELPERS = {"src/common/test_util.h": {"SBX_SKIP_OR_FAIL", "SBX_SKIP_NOT_APPLICABLE"}}
PY_HELPERS = {"tests/e2e/conftest.py": {"skip_or_fail", "not_applicable_on_fake_runtime",
                                        "ns_runtime_only", "not_run_without_optional_component"}}
PY_SKIP_ATTRS = {"skip", "skipif", "xfail", "importorskip", "skipTest", "SkipTest", "skipIf",
                 "skipUnless", "expectedFailure"}
PY_SKIP_MODULES = {"pytest", "unittest", "_pytest"}
HELPER_HINT_CC = "use SBX_SKIP_OR_FAIL (src/common/test_util.h)"
HELPER_HINT_PY = "use skip_or_fail from tests/e2e/conftest.py"


def is_build_dir(p: Path) -> bool:
    return (p / "CMakeCache.txt").exists() or (p / "build.ninja").exists()


def walk(root: Path, top: str):
    base = root / top
    if not base.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(base):
        d = Path(dirpath)
        dirnames[:] = sorted(n for n in dirnames
                             if n not in SKIP_DIR_NAMES and not is_build_dir(d / n))
        for f in sorted(filenames):
            yield d / f


# ---- CMake -------------------------------------------------------------------------------------

def strip_cmake_comments(text: str) -> str:
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif c == "#":
            m = re.match(r"#\[(=*)\[", text[i:])
            if m:
                end = text.find("]" + m.group(1) + "]", i)
                i = n if end < 0 else end + len(m.group(1)) + 2
            else:
                j = text.find("\n", i)
                i = n if j < 0 else j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def cmake_commands(text: str):
    """(name, [args]) for every command invocation; quoted arguments lose their quotes."""
    text = strip_cmake_comments(text)
    for m in re.finditer(r"(?m)^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(", text):
        depth, j, start = 1, m.end(), m.end()
        while j < len(text) and depth:
            if text[j] == '"':
                j += 1
                while j < len(text) and text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
            elif text[j] == "(":
                depth += 1
            elif text[j] == ")":
                depth -= 1
            j += 1
        body = text[start:j - 1]
        args = [a[1:-1] if a.startswith('"') else a
                for a in re.findall(r'"(?:\\.|[^"\\])*"|[^\s()]+', body)]
        yield m.group(1).lower(), args


def keyword_values(args: list[str], key: str, keys: set[str]) -> list[str]:
    out, on = [], False
    for a in args:
        if a in keys:
            on = a == key
        elif on:
            out.append(a)
    return out


def expand(args: list[str], variables: dict[str, list[str]]) -> list[str]:
    out = []
    for a in args:
        m = re.fullmatch(r"\$\{([A-Za-z0-9_]+)\}", a)
        out.extend(variables.get(m.group(1), []) if m else [a])
    return out


def resolve_word(word: str, d: Path, root: Path) -> str:
    """An add_test argument as an absolute path, where it names a file."""
    for var, val in (("CMAKE_CURRENT_SOURCE_DIR", d), ("CMAKE_CURRENT_LIST_DIR", d),
                     ("PROJECT_SOURCE_DIR", root), ("CMAKE_SOURCE_DIR", root)):
        word = word.replace("${" + var + "}", str(val))
    if "$" in word or "<" in word:
        return word
    return str((d / word).resolve())


def cmake_registrations(root: Path):
    """The source files of test targets, and every word that an add_test names."""
    test_sources: set[Path] = set()
    add_test_words: set[str] = set()
    executables: dict[str, tuple[Path, list[str]]] = {}
    run_targets: set[str] = set()
    lists = [root / "CMakeLists.txt"]
    for top in ("src", "tests", "bench", "cmake"):
        lists += [p for p in walk(root, top) if p.name == "CMakeLists.txt"]
    for cml in lists:
        if not cml.is_file():
            continue
        d = cml.parent
        variables: dict[str, list[str]] = {}
        for name, args in cmake_commands(cml.read_text(errors="replace")):
            if name == "set" and args:
                variables[args[0]] = expand(args[1:], variables)
            elif name == "sbx_cc_test":
                keys = {"NAME", "SRCS", "DEPS", "LABELS", "TEST_PREFIX"}
                for s in expand(keyword_values(args, "SRCS", keys), variables):
                    test_sources.add((d / s).resolve())
            elif name == "add_executable" and args:
                executables[args[0]] = (d, expand(args[1:], variables))
            elif name == "add_test":
                words = args
                if "COMMAND" in args:
                    words = args[args.index("COMMAND") + 1:]
                    run_targets.add(words[0] if words else "")
                elif len(args) >= 2:
                    run_targets.add(args[1])
                add_test_words.update(resolve_word(w, d, root) for w in words)
            elif name == "gtest_discover_tests" and args:
                run_targets.add(args[0])
    for target, (d, srcs) in executables.items():
        if target in run_targets:
            test_sources.update((d / s).resolve() for s in srcs)
    return test_sources, add_test_words


def check_orphans_source(root: Path) -> tuple[list[str], int]:
    problems = []
    test_sources, add_test_words = cmake_registrations(root)
    cc = [p for top in CC_TEST_ROOTS for p in walk(root, top) if p.name.endswith("_test.cc")]
    for p in cc:
        if p.resolve() not in test_sources:
            problems.append(f"ORPHAN: {p.relative_to(root)} is in no test target: no sbx_cc_test "
                            f"(or add_executable run by add_test) in any CMakeLists.txt lists it")
    scripts = [p for top in SCRIPT_TEST_ROOTS for p in walk(root, top)
               if p.name.endswith(("_test.py", "_test.sh"))]
    for p in scripts:
        rel = str(p.relative_to(root))
        if str(p.resolve()) not in add_test_words:
            problems.append(f"ORPHAN: {rel} is run by no add_test in any CMakeLists.txt")
    return problems, len(cc) + len(scripts)


def check_orphans_build(root: Path, build: Path) -> list[str]:
    problems = []
    ninja = build / "build.ninja"
    try:
        text = ninja.read_text(errors="replace")
    except OSError as e:
        return [f"cannot read {ninja}: {e} (configure the build first)"]
    src_targets: dict[Path, set[str]] = {}
    target_outputs: dict[str, Path] = {}
    # build <dir>/CMakeFiles/<target>.dir/<source>.o: CXX_COMPILER__<target>_<config> <source>
    for m in re.finditer(r"(?m)^build \S*?CMakeFiles/([^/\s]+)\.dir/\S+\.o: \w+_COMPILER__\S+ (\S+)", text):
        target, src = m.groups()
        src_path = Path(src) if os.path.isabs(src) else (build / src)
        src_targets.setdefault(src_path.resolve(), set()).add(target)
    # build <output> [<byproducts>...]: CXX_EXECUTABLE_LINKER__<target>_<config> <objects>
    for m in re.finditer(r"(?m)^build (\S+)(?: [^\n]*?)?: \w+?_EXECUTABLE_LINKER__(\S+)_[^_\s]+ ", text):
        out, target = m.groups()
        target_outputs[target] = (build / out.replace("$:", ":")).resolve()
    try:
        res = subprocess.run(["ctest", "--test-dir", str(build), "--show-only=json-v1"],
                             capture_output=True, text=True, timeout=120)
        listing = json.loads(res.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return [f"cannot list the tests of {build} with ctest --show-only=json-v1: {e}"]
    commands = set()
    not_built = set()
    no_command = 0  # ctest lists no command for a test whose executable does not exist (yet)
    for t in listing.get("tests", []):
        cmd = t.get("command") or []
        if cmd:
            commands.add(Path(cmd[0]).resolve())
        else:
            no_command += 1
        if t.get("name", "").endswith("_NOT_BUILT"):
            not_built.add(t["name"][: -len("_NOT_BUILT")])
    for top in CC_TEST_ROOTS:
        for p in walk(root, top):
            if not p.name.endswith("_test.cc"):
                continue
            rel = p.relative_to(root)
            targets = src_targets.get(p.resolve(), set())
            if not targets:
                problems.append(f"ORPHAN: {rel} is compiled into no target of {build} "
                                f"(a condition false in this configuration, or no test target lists it)")
                continue
            run = [t for t in targets if target_outputs.get(t) in commands]
            if run:
                continue
            unbuilt = sorted(t for t in targets if t in not_built)
            if unbuilt:
                problems.append(f"NOT BUILT: {rel}: {', '.join(unbuilt)} not built yet in {build}, "
                                f"so ctest cannot list its tests (build first)")
            else:
                hint = f" ({no_command} ctest tests name a binary that does not exist: build first?)" \
                    if no_command else ""
                problems.append(f"ORPHAN: {rel} is compiled into {', '.join(sorted(targets))}, "
                                f"but ctest in {build} runs no test of it{hint}")
    return problems


# ---- raw skips ---------------------------------------------------------------------------------

def strip_cc(text: str) -> str:
    """Comments and the insides of string/char literals blanked, every other character where it
    was (so line numbers and offsets hold: tools/check_house.py slices the original by them)."""
    def blank(chunk: str) -> str:
        return re.sub(r"[^\n]", " ", chunk)

    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(blank(text[i:j]))
            i = j
        elif c == "R" and re.match(r'R"([^(\s]*)\(', text[i:]):
            delim = re.match(r'R"([^(\s]*)\(', text[i:]).group(1)
            j = text.find(")" + delim + '"', i)
            j = n if j < 0 else j + len(delim) + 2
            out.append('R"' + blank(text[i + 2:j - 1]) + text[j - 1:j])
            i = j
        elif c in "\"'" and not (c == "'" and i > 0 and text[i - 1].isalnum()):
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j, n - 1) if j >= n else j
            out.append(c + blank(text[i + 1:j]) + (text[j] if j < n and text[j] == c else ""))
            i = j + 1 if j < n and text[j] == c else j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def lint_cc(path: Path, rel: str) -> list[str]:
    problems = []
    allowed = CC_HELPERS.get(rel, set())
    macro, continued = None, False
    for no, line in enumerate(strip_cc(path.read_text(errors="replace")).splitlines(), 1):
        if not continued:
            m = re.match(r"\s*#\s*define\s+([A-Za-z_][A-Za-z0-9_]*)", line)
            macro = m.group(1) if m else None
        continued = line.rstrip().endswith("\\")
        if re.search(r"\bGTEST_SKIP\b", line) and macro not in allowed:
            problems.append(f"RAW SKIP: {rel}:{no}: GTEST_SKIP ignores SBX_TESTS_MUST_RUN; {HELPER_HINT_CC}")
        if re.search(r"\b(TEST|TEST_F|TEST_P|TYPED_TEST)\s*\(\s*\w+\s*,\s*DISABLED_", line) or \
                re.search(r"\b(TEST|TEST_F|TEST_P|TYPED_TEST)\s*\(\s*DISABLED_", line):
            problems.append(f"RAW SKIP: {rel}:{no}: a DISABLED_ test never runs; fix it or delete it")
    return problems


def dotted_root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def lint_py(path: Path, rel: str) -> list[str]:
    try:
        tree = ast.parse(path.read_text(errors="replace"), filename=str(path))
    except SyntaxError as e:
        return [f"cannot parse {rel}: {e}"]
    allowed = PY_HELPERS.get(rel, set())
    aliases = set(PY_SKIP_MODULES)
    direct: set[str] = set()  # skip functions imported by name (from pytest import skip)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PY_SKIP_MODULES:
                    aliases.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PY_SKIP_MODULES:
            for a in node.names:
                if a.name in PY_SKIP_ATTRS:
                    direct.add(a.asname or a.name)
                else:
                    aliases.add(a.asname or a.name)  # e.g. from pytest import mark
    problems = []

    def visit(node: ast.AST, func: str | None):
        for child in ast.iter_child_nodes(node):
            f = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            hit = None
            if isinstance(child, ast.Attribute) and child.attr in PY_SKIP_ATTRS and (
                    dotted_root(child.value) in aliases or child.attr in ("skipTest", "SkipTest")):
                hit = child.attr
            elif isinstance(child, ast.Name) and child.id in direct and isinstance(child.ctx, ast.Load):
                hit = child.id
            if hit and f not in allowed:
                problems.append(f"RAW SKIP: {rel}:{child.lineno}: {hit} ignores SBX_TESTS_MUST_RUN; "
                                f"{HELPER_HINT_PY}")
            visit(child, f)

    visit(tree, None)
    return problems


def check_skips(root: Path) -> tuple[list[str], int]:
    problems, n = [], 0
    for top in LINT_ROOTS:
        for p in walk(root, top):
            rel = str(p.relative_to(root))
            if p.suffix in (".cc", ".h", ".cpp", ".hpp"):
                n += 1
                problems += lint_cc(p, rel)
            elif p.suffix == ".py":
                n += 1
                problems += lint_py(p, rel)
    return problems, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--build-dir", help="also check this configured (and built) build tree")
    a = ap.parse_args(argv)
    root = Path(a.root).resolve()
    problems, n_tests = check_orphans_source(root)
    if a.build_dir:
        problems += check_orphans_build(root, Path(a.build_dir).resolve())
    skip_problems, n_files = check_skips(root)
    problems += skip_problems
    for p in problems:
        print(f"check_tests: {p}")
    if problems:
        print(f"check_tests: FAILED: {len(problems)} problem(s)")
        return 1
    where = f" and in {a.build_dir}" if a.build_dir else ""
    print(f"check_tests: {n_tests} test files, each in a test target{where}; "
          f"{n_files} files without a raw skip")
    return 0


if __name__ == "__main__":
    sys.exit(main())
