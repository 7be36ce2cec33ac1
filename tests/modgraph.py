#!/usr/bin/env python3
"""The module graph of src/: fails on an import circle or an arrow that breaks the layering
written in ARCHITECTURE.md ("Layers"). Reads `crate::…` and `super::…` paths per file (a
module is a file); `mod` declarations are not arrows, `pub use` re-exports are, and a path
through a re-export counts as an arrow to the module that defines the item. Tests inside
`#[cfg(test)] mod tests` are skipped. Usage: python3 tests/modgraph.py [--print]"""

import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")

# Layering rules: (module prefix, forbidden module prefixes, forbidden external crates).
RULES = [
    # The protocol's vocabulary is the bottom layer: it names no other module, no HTTP, no I/O.
    ("protocol", ["*"], ["axum", "hyper", "http", "reqwest", "tokio"]),
    # The handlers know no transport.
    ("methods", ["endpoint", "server", "admin", "gateway", "cli"], ["axum", "hyper", "http"]),
    # The upstream layer knows no downstream transport, no gateway, no dispatch.
    ("upstream", ["endpoint", "server", "admin", "gateway", "hub", "call", "methods", "cli"],
     ["axum", "hyper"]),
    # Leaves.
    ("config", ["*"], []),
    ("config_load", ["*"], []),
    ("tool_name", ["*"], []),
    # Policy rules and rate limits (issue 49): CEL over plain values, token buckets.
    ("policy", ["*"], []),
    ("audit", ["*"], []),
    # Outgoing TLS (issue 46): rustls configs and TLS failures named, for upstreams and OTLP.
    ("tls", ["*"], []),
    # Traces: the vocabulary of spans and their context, beside the config it reads.
    ("telemetry", ["*"], ["axum", "hyper"]),
    # Only the gateway starts the server; nothing below it names the gateway.
    ("hub", ["gateway", "server", "endpoint", "admin", "cli"], []),
    ("call", ["gateway", "server", "endpoint", "admin", "cli"], []),
    ("endpoint", ["gateway", "admin", "cli"], []),
    ("server", ["gateway", "admin", "cli"], []),
    ("session", ["gateway", "hub", "server", "endpoint", "upstream", "call", "methods", "cli"], []),
    # The registration wing reaches the server through `registration::lifecycle`'s trait only.
    ("registration", ["gateway", "hub", "server", "endpoint", "upstream", "call", "session",
                      "methods", "cli"], []),
    # Refusals are observed, never served: no transport, no dispatch, no gateway.
    ("refusals", ["gateway", "hub", "server", "endpoint", "upstream", "call", "methods", "cli"], []),
    ("store", ["gateway", "hub", "server", "endpoint", "upstream", "call", "session", "cli"],
     ["axum", "hyper"]),
    # Tasks (issue 51): the table only keeps state; the wire forms are pure translation (no
    # hub, no pool: nothing that does I/O); nothing in tasks/ names the call or a transport.
    ("tasks::table", ["gateway", "hub", "server", "endpoint", "upstream", "call", "methods",
                      "tasks::wire", "tasks::settle", "tasks::driver", "cli"], []),
    ("tasks::wire", ["gateway", "hub", "server", "endpoint", "call", "methods", "tasks::settle",
                     "tasks::driver", "cli"], []),
    ("tasks", ["gateway", "server", "endpoint", "admin", "call", "methods", "cli"],
     ["axum", "hyper"]),
]
# The layers of ARCHITECTURE.md ("Layers") as ranks: an arrow may point to a module of the
# same rank or a lower one, never up. The longest matching prefix gives a module's rank; a
# module that matches none fails the check (every module is placed on purpose).
LAYERS = [
    (10, ["cli", "admin", "console"]),
    (9, ["gateway"]),
    (8, ["server"]),
    (7, ["endpoint"]),
    (6, ["methods", "call"]),
    (5, ["hub", "tasks"]),
    (4, ["upstream"]),
    (3, ["session", "listen", "mrtr", "approval", "metrics", "refusals", "fence"]),
    (2, ["registration", "connections", "store", "sd_notify"]),
    (1, ["tools", "demo_upstream"]),
    # The vocabulary every layer speaks: the protocol (versions, methods, JSON-RPC, the one
    # error value — no dispatch), the config, names, the audit trail, the std-lock helpers.
    (0, ["protocol", "config", "config_load", "tool_name", "audit", "sync", "telemetry", "tls",
         "policy"]),
]


def rank_of(m):
    best, rank = -1, None
    for r, prefixes in LAYERS:
        for p in prefixes:
            if within(m, p) and len(p) > best:
                best, rank = len(p), r
    return rank


# What the leaves may still use.
LEAF_ALLOWED = {"config": ["sync", "tool_name", "policy"],
                "policy": ["sync"],
                "config_load": ["config", "sync", "tool_name", "tls"],
                "audit": ["config", "sync", "protocol"],
                "telemetry": ["config", "sync", "tls", "protocol"], "protocol": [],
                "tls": ["config"]}


def module_of(path):
    rel = os.path.relpath(path, SRC)[:-3]
    parts = rel.split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts)


def strip_tests(text):
    # Drop `#[cfg(test)] mod … { … }` blocks (brace matching on code without strings is
    # enough here) and comments.
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    text = "".join(out)
    text = re.sub(r"//[^\n]*", "", text)
    return text


def expand_use(tree):
    """Expands `a::{b, c::{d, e}}` into ['a::b', 'a::c::d', 'a::c::e']."""
    tree = tree.strip()
    m = re.match(r"^(.*?)\{(.*)\}$", tree, re.S)
    if not m:
        return [re.sub(r"\s+as\s+\w+$", "", tree)]
    prefix, inner = m.group(1), m.group(2)
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    items.append(cur)
    out = []
    for it in items:
        if it.strip():
            for e in expand_use(it):
                out.append((prefix + e).replace("::self", ""))
    return out


def main():
    files = []
    for root, _, names in os.walk(SRC):
        for n in names:
            if n.endswith(".rs") and not (root == SRC and n == "main.rs"):
                files.append(os.path.join(root, n))
    mods = {module_of(f): f for f in files}
    texts = {m: strip_tests(open(f, encoding="utf-8").read()) for m, f in mods.items()}
    # Re-exports: module -> {name: target path}
    reexports = {}
    for m, t in texts.items():
        for u in re.findall(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", t):
            for p in expand_use(u):
                reexports.setdefault(m, {})[p.split("::")[-1]] = absolute(m, p, mods)
    edges = {m: set() for m in mods}
    externals = {m: set() for m in mods}
    for m, t in texts.items():
        paths = []
        for u in re.findall(r"\buse\s+([^;]+);", t):
            paths.extend(expand_use(u))
        # A path that opens a `use` group (`crate::a::{b, c}`) is read by the `use` parse
        # above, item by item: it is no arrow to `a` itself (a re-export shim would be one).
        paths.extend(re.findall(r"\b((?:crate|super)(?:::\w+)+)(?!\w|::)", t))
        # Paths through a child module written relative to this one (`serve::run(…)`).
        for c in {k.rsplit("::", 1)[-1] for k in mods if k.startswith(m + "::" if m else "") and k.count("::") == (m.count("::") + 1 if m else 0)}:
            if re.search(r"(?<![:\w])" + c + r"::\w", t):
                paths.append(c + "::x")
        for p in paths:
            first = p.split("::")[0].strip()
            child = f"{m}::{first}" if m else first
            if first not in ("crate", "super", "self") and child in mods:
                p = "self::" + p.strip()
            elif first not in ("crate", "super", "self", "std", "core", "alloc"):
                externals[m].add(first)
                continue
            target = resolve(absolute(m, p, mods), mods, reexports)
            if target is not None and target != m:
                edges[m].add(target)
    if "--print" in sys.argv:
        for m in sorted(edges):
            print(f"{m or '(crate)'} -> {', '.join(sorted(x or '(crate)' for x in edges[m]))}")
    problems = []
    for cyc in cycles(edges):
        problems.append("import circle: " + " -> ".join(x or "(crate)" for x in cyc))
    for m in sorted(edges):
        for prefix, banned, crates in RULES:
            if not within(m, prefix):
                continue
            for t in sorted(edges[m]):
                if "*" in banned:
                    if not any(within(t, a) for a in LEAF_ALLOWED.get(prefix, [])) and not within(t, prefix):
                        problems.append(f"layering: {m} -> {t} ({prefix} is a leaf)")
                elif any(within(t, b) for b in banned):
                    problems.append(f"layering: {m} -> {t} (forbidden for {prefix})")
            for c in sorted(externals[m] & set(crates)):
                problems.append(f"layering: {m} uses crate {c} (forbidden for {prefix})")
    for m in sorted(edges):
        if m == "":
            continue
        r = rank_of(m)
        if r is None:
            problems.append(f"layering: {m} has no layer (add it to LAYERS and ARCHITECTURE.md)")
            continue
        for t in sorted(edges[m]):
            rt = rank_of(t)
            if rt is not None and rt > r:
                problems.append(f"layering: {m} (layer {r}) -> {t} (layer {rt}): an import from above")
    # A folder sits on one layer: its modules share a rank (a folder drawn as one box shows no
    # arrow climbing back up into itself).
    folders = {}
    for m in mods:
        if "::" in m:
            folders.setdefault(m.split("::")[0], set()).add(m)
    for f, ms in sorted(folders.items()):
        ranks = {rank_of(x) for x in ms | ({f} if f in mods else set())}
        if len(ranks) > 1:
            problems.append(f"layering: folder {f}/ spans layers {sorted(r for r in ranks if r is not None)}")
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(f"module graph: {len(mods)} modules, no circle, layering holds, each folder on one layer")


def within(m, prefix):
    return m == prefix or m.startswith(prefix + "::")


def absolute(m, p, mods):
    parts = [x.strip() for x in p.split("::")]
    child = f"{m}::{parts[0]}" if m else parts[0]
    if parts[0] not in ("crate", "super", "self") and child in mods:
        parts = ["self"] + parts
    if parts[0] == "crate":
        return "::".join(parts[1:])
    base = m.split("::") if m else []
    # `super` in a file module `a::b` (b.rs or b/mod.rs) is `a`.
    while parts and parts[0] == "super":
        base = base[:-1]
        parts = parts[1:]
    if parts and parts[0] == "self":
        parts = parts[1:]
    return "::".join(base + parts)


def resolve(path, mods, reexports, depth=0):
    parts = path.split("::") if path else []
    for k in range(len(parts), -1, -1):
        cand = "::".join(parts[:k])
        if cand in mods:
            rest = parts[k:]
            if rest and depth < 8 and rest[0] in reexports.get(cand, {}):
                target = reexports[cand][rest[0]]
                if target != path:
                    return resolve(target + "".join("::" + r for r in rest[1:]) if rest[1:] else target,
                                   mods, reexports, depth + 1)
            return cand
    return None


def cycles(edges):
    # Tarjan's strongly connected components; every component of more than one module is a
    # circle (reported as one path through it).
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp) + [sorted(comp)[0]])

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    main()
