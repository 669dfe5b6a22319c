#!/usr/bin/env python3
"""Turns `perf script` output into a flame graph (SVG), standard library only.

Debian 12 packages no FlameGraph scripts, so this does what stackcollapse-perf.pl and
flamegraph.pl do for the cases docs/benchmarks.md needs: each sample's stack (leaf first in
perf's output) becomes a "root;…;leaf" line with a count (the folded form), and the folded
stacks become nested boxes whose width is the share of samples that passed through that frame.
The root of each stack is the process name (perf's comm), so sbxd, sbx-agent and the commands
it ran sit side by side. Kernel frames get the suffix `_[k]` and a different colour.

Usage:
  perf script -i perf.data | python3 tools/flamegraph.py --title T > out.svg
  python3 tools/flamegraph.py --in perf.txt --folded-out out.folded --out out.svg
  python3 tools/flamegraph.py --folded-in out.folded --out out.svg

The SVG needs no script: every box has a tooltip (<title>: frame, samples, share of the total),
and a box's label is cut to what fits its width (boxes narrower than --min-width px are left out,
their samples still count in their parents).
"""
from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections import Counter
from html import escape

# A stack line: optional spaces, hex address, symbol (may contain spaces and parentheses, e.g.
# "operator new(unsigned long)"), then the object file in parentheses at the end, which may hold
# one parenthesised word itself: "(/memfd:sbx-agent (deleted))", the agent sbxd runs from a memfd.
FRAME_RE = re.compile(r"^\s*([0-9a-fA-F]+)\s+(.*?)\s*\(((?:[^()]|\([^()]*\))*)\)\s*$")
OFFSET_RE = re.compile(r"\+0x[0-9a-fA-F]+$")


def frame_name(sym: str, dso: str) -> str:
    sym = OFFSET_RE.sub("", sym.strip())
    if not sym or sym == "[unknown]":
        # Name what we can: the object the address is in.
        base = dso.rsplit("/", 1)[-1].replace(" (deleted)", "") if dso else "?"
        sym = f"[{base}]" if not base.startswith("[") else base
    # ';' separates frames in the folded form.
    sym = sym.replace(";", ":")
    if dso.startswith("[kernel.") or dso.endswith(".ko"):
        sym += "_[k]"
    return sym


HEADER_RE = re.compile(r"^(?P<comm>.+?)\s+(?P<pid>-?\d+)(?:/(?P<tid>-?\d+))?\s+"
                       r"(?:\[\d+\]\s+)?(?P<time>\d+\.\d+):\s*(?P<rest>.*)$")
FORK_RE = re.compile(r"PERF_RECORD_FORK\((\d+):(\d+)\):\((\d+):(\d+)\)")


def short_name(name: str) -> str:
    """C++ names without template arguments and parameter lists, which in Asio's and Beast's
    frames run to hundreds of characters: "a::b<x<y>>::c(int)" → "a::b<…>::c". The kernel
    suffix and "(anonymous namespace)" stay; "operator<" and friends are not taken for brackets."""
    suffix = "_[k]" if name.endswith("_[k]") else ""
    core = name[: -len(suffix)] if suffix else name
    core = core.replace("(anonymous namespace)", "\x00")
    out, depth, i = [], 0, 0
    while i < len(core):
        if core.startswith("operator", i) and depth == 0:
            j = i + len("operator")
            while j < len(core) and core[j] in "<>=!+-*/%&|^~[]()," and not core.startswith("()", j + 1) \
                    and j - i < len("operator") + 3:
                j += 1
            out.append(core[i:j])
            i = j
            continue
        c = core[i]
        if c == "<":
            if depth == 0:
                out.append("<…>")
            depth += 1
        elif c == ">" and depth > 0:
            depth -= 1
        elif c == "(" and depth == 0:
            # A parameter list: drop it and whatever follows on this frame (" const", "[clone]").
            rest = core[i:]
            close = rest.find(")")
            tail = rest[close + 1:] if close >= 0 else ""
            if "::" in tail:  # "f(int)::{lambda()#1}::operator()": keep the part after it
                out.append(tail[tail.find("::"):])
            break
        elif depth == 0:
            out.append(c)
        i += 1
    return "".join(out).replace("\x00", "(anonymous namespace)").strip() + suffix


def parse(lines):
    """perf script text → (samples, parents): samples as (comm, pid, frames root first);
    parents maps a process to the one that forked it, from PERF_RECORD_FORK lines
    (`perf script --show-task-events`)."""
    samples = []
    parents: dict[int, int] = {}
    cur = None  # [comm, pid, frames leaf first]

    def flush():
        nonlocal cur
        if cur is not None:
            frames = cur[2]
            samples.append((cur[0], cur[1], list(reversed(frames))))
        cur = None

    for raw in lines:
        line = raw.rstrip("\n")
        if not line.strip():
            flush()
            continue
        if line.startswith("#"):
            continue
        if line[0] in " \t":
            if cur is None:
                continue
            m = FRAME_RE.match(line)
            name = frame_name(m.group(2), m.group(3)) if m else \
                frame_name(line.strip().split(None, 1)[-1], "")
            # A broken frame-pointer chain repeats "[unknown]"; one box says as much.
            if not (cur[2] and name == cur[2][-1] and name.startswith("[")):
                cur[2].append(name)
            continue
        flush()
        m = HEADER_RE.match(line)
        if not m:
            continue
        rest = m.group("rest")
        f = FORK_RE.search(rest)
        if f:
            child, parent = int(f.group(1)), int(f.group(3))
            if child != parent:  # a new process, not a thread of the same one
                parents[child] = parent
            continue
        if rest.startswith("PERF_RECORD_"):
            continue
        cur = [m.group("comm").strip().replace(";", ":"), int(m.group("pid")), []]
    flush()
    return samples, parents


def descendants(roots, parents: dict[int, int]) -> set[int]:
    """The roots and every process forked from them, at any depth."""
    children: dict[int, list[int]] = {}
    for c, p in parents.items():
        children.setdefault(p, []).append(c)
    out, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo.extend(children.get(pid, []))
    return out


def fold(samples, keep_pids=None, keep_comm=None, drop_comm=None, short=False) -> Counter:
    """Counter{"comm;root;…;leaf": samples}. With keep_pids and/or keep_comm, a sample stays
    when its pid is in keep_pids or its comm matches keep_comm; drop_comm removes matches."""
    stacks: Counter = Counter()
    filtering = keep_pids is not None or keep_comm is not None
    for comm, pid, frames in samples:
        if filtering and not ((keep_pids is not None and pid in keep_pids) or
                              (keep_comm is not None and keep_comm.search(comm))):
            continue
        if drop_comm is not None and drop_comm.search(comm):
            continue
        if short:
            frames = [short_name(f) for f in frames]
        stacks[";".join([comm] + frames)] += 1
    return stacks


def collapse(lines) -> Counter:
    """perf script text → Counter{"comm;root;…;leaf": samples}, every sample."""
    samples, _ = parse(lines)
    return fold(samples)


def read_folded(lines) -> Counter:
    stacks: Counter = Counter()
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            raise ValueError(f"not a folded line: {line!r}")
        stacks[stack] += int(n)
    return stacks


def write_folded(stacks: Counter, out) -> None:
    for stack in sorted(stacks):
        out.write(f"{stack} {stacks[stack]}\n")


class Node:
    __slots__ = ("name", "value", "children")

    def __init__(self, name: str):
        self.name = name
        self.value = 0
        self.children: dict[str, Node] = {}


def build_tree(stacks: Counter) -> Node:
    root = Node("all")
    for stack, n in stacks.items():
        root.value += n
        node = root
        for f in stack.split(";"):
            node = node.children.setdefault(f, Node(f))
            node.value += n
    return root


def color(name: str) -> str:
    """Stable colour per name: kernel frames orange, unresolved grey, the rest warm reds/yellows
    (sbx's own code a little greener, so it stands out from libraries)."""
    h = int(hashlib.md5(name.encode()).hexdigest()[:8], 16)
    v1, v2 = (h & 0xFF) / 255, ((h >> 8) & 0xFF) / 255
    if name.endswith("_[k]"):
        return f"rgb({200 + int(55 * v1)},{120 + int(60 * v2)},{40 + int(30 * v1)})"
    if name.startswith("[") and name.endswith("]"):
        return f"rgb({170 + int(30 * v1)},{170 + int(30 * v1)},{170 + int(30 * v1)})"
    if "sbx::" in name:
        return f"rgb({180 + int(60 * v1)},{190 + int(50 * v2)},{60 + int(40 * v1)})"
    return f"rgb({205 + int(50 * v1)},{int(180 * v2)},{int(55 * v1)})"


def render(stacks: Counter, title: str = "Flame graph", subtitle: str = "", width: int = 1200,
           frame_h: int = 16, font_size: float = 11.0, min_width: float = 0.1) -> str:
    root = build_tree(stacks)
    total = root.value
    pad_x, top, bottom = 10, 50 if subtitle else 34, 28
    usable = width - 2 * pad_x

    def depth(n: Node) -> int:
        return 1 + max((depth(c) for c in n.children.values()), default=0)

    levels = depth(root) if total else 1
    height = top + levels * frame_h + bottom
    char_w = font_size * 0.59
    out = [
        '<?xml version="1.0" standalone="no"?>',
        f'<svg version="1.1" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'xmlns="http://www.w3.org/2000/svg">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#f8f8f0"/>',
        f'<text x="{width / 2}" y="22" font-size="16" font-family="Verdana,sans-serif" '
        f'text-anchor="middle">{escape(title)}</text>',
    ]
    if subtitle:
        out.append(f'<text x="{width / 2}" y="40" font-size="12" font-family="Verdana,sans-serif" '
                   f'text-anchor="middle" fill="#555">{escape(subtitle)}</text>')
    out.append(f'<text x="{pad_x}" y="{height - 10}" font-size="11" '
               f'font-family="Verdana,sans-serif" fill="#555">{total} samples; width = share of '
               f'samples; the root of each tower is the process; hover a box for its numbers; '
               f'_[k] = kernel</text>')
    if total == 0:
        out.append(f'<text x="{width / 2}" y="{top + 12}" text-anchor="middle">no samples</text>')
        out.append("</svg>")
        return "\n".join(out) + "\n"
    out.append(f'<g font-family="DejaVu Sans Mono,monospace" font-size="{font_size}">')

    def draw(node: Node, x: float, level: int):
        w = node.value / total * usable
        if w < min_width:
            return
        y = top + (levels - 1 - level) * frame_h  # the root at the bottom
        pct = 100.0 * node.value / total
        label = f"{node.name} ({node.value} samples, {pct:.2f}%)"
        fill = "rgb(230,230,230)" if level == 0 else color(node.name)
        out.append(f'<g><title>{escape(label)}</title>'
                   f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{frame_h - 1}" '
                   f'fill="{fill}" rx="2" ry="2"/>')
        fit = int((w - 6) / char_w)
        if fit >= 3:
            text = node.name if len(node.name) <= fit else node.name[: fit - 2] + ".."
            out.append(f'<text x="{x + 3:.2f}" y="{y + frame_h - 4.5}">{escape(text)}</text>')
        out.append("</g>")
        cx = x
        # Alphabetical, as flamegraph.pl does: the x axis is not time, and equal stacks merge.
        for name in sorted(node.children):
            child = node.children[name]
            draw(child, cx, level + 1)
            cx += child.value / total * usable

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    draw(root, pad_x, 0)
    out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--in", dest="inp", help="perf script output (default: stdin)")
    src.add_argument("--folded-in", help="folded stacks instead of perf script output")
    ap.add_argument("--out", help="SVG path (default: stdout)")
    ap.add_argument("--folded-out", help="also write the folded stacks here")
    ap.add_argument("--title", default="Flame graph")
    ap.add_argument("--subtitle", default="")
    ap.add_argument("--width", type=int, default=1200)
    ap.add_argument("--min-width", type=float, default=0.1, help="px; narrower boxes are omitted")
    ap.add_argument("--pid-tree", type=int, action="append", default=[],
                    help="keep samples of this process and every process it forked during the "
                         "recording (needs `perf script --show-task-events`; repeatable)")
    ap.add_argument("--keep-comm", help="also keep samples whose process name matches this "
                                        "regex (e.g. kernel threads: '^(kworker|rcu|ksoftirqd)')")
    ap.add_argument("--drop-comm", help="drop samples whose process name matches this regex")
    ap.add_argument("--short-names", action="store_true",
                    help="drop C++ template arguments and parameter lists from frame names")
    ap.add_argument("--only", action="append", default=[],
                    help="keep only stacks whose process (root frame) is this (repeatable)")
    args = ap.parse_args(argv)

    if args.folded_in:
        if args.pid_tree:
            ap.error("--pid-tree needs perf script output, not folded stacks")
        with open(args.folded_in) as f:
            stacks = read_folded(f)
        if args.keep_comm or args.drop_comm:
            keep = re.compile(args.keep_comm) if args.keep_comm else None
            drop = re.compile(args.drop_comm) if args.drop_comm else None
            stacks = Counter({s: n for s, n in stacks.items()
                              if (keep is None or keep.search(s.split(";", 1)[0])) and
                              (drop is None or not drop.search(s.split(";", 1)[0]))})
        if args.short_names:
            short: Counter = Counter()
            for st, n in stacks.items():
                root, _, rest = st.partition(";")
                short[";".join([root] + [short_name(f) for f in rest.split(";") if rest])] += n
            stacks = short
    else:
        if args.inp:
            with open(args.inp, errors="replace") as f:
                samples, parents = parse(f)
        else:
            samples, parents = parse(sys.stdin)
        keep_pids = descendants(args.pid_tree, parents) if args.pid_tree else None
        keep_comm = re.compile(args.keep_comm) if args.keep_comm else None
        drop_comm = re.compile(args.drop_comm) if args.drop_comm else None
        stacks = fold(samples, keep_pids, keep_comm, drop_comm, args.short_names)
    if args.only:
        keep = set(args.only)
        stacks = Counter({s: n for s, n in stacks.items() if s.split(";", 1)[0] in keep})
    if args.folded_out:
        with open(args.folded_out, "w") as f:
            write_folded(stacks, f)
    svg = render(stacks, args.title, args.subtitle, args.width, min_width=args.min_width)
    if args.out:
        with open(args.out, "w") as f:
            f.write(svg)
    else:
        sys.stdout.write(svg)
    return 0 if stacks else 1


if __name__ == "__main__":
    sys.exit(main())
