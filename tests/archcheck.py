#!/usr/bin/env python3
"""ARCHITECTURE.md stays true: every test its invariants name exists, and it cites no document
outside the repository.

Run by tests/run.sh next to tests/modgraph.py. In the "## Invariants" section, every backticked
name that reads as a test is looked up:
  `file::fn`                  a test function in tests/<file>.rs (or tests/<file>/*.rs)
  `a::b::tests::fn`           a unit test: `fn fn` in src/a/b.rs or a file under src/a/b/
  `a::b::tests::{f, g}`       each of them
  `a::tests`                  a `mod tests` in src/a.rs (or under src/a/)
  `test_name` (Python)        a `def test_name` under tests/python/ or tests/shipped/
  tests/<path>                that path exists
Everything else in backticks (types, functions, config keys) is prose and not checked here.
Also: no link or path that leaves the repository (`../`, DESIGN.md, FIELD.md, ...); no file
under src/ over MAX_FILE_LINES lines and no function over MAX_FN_LINES lines (from its `fn` line to
its closing brace), unless SIZE_EXCEPTIONS names it with the reason.
Exit 1 with one line per problem.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
TESTS = ROOT / "tests"
OUTSIDE = ("../", "DESIGN.md", "FIELD.md", "CLUSTER.md", "TASKS.md", "OTEL.md", "MCP-NOTES.md",
           "CONVENTIONS.md", "INTEROP.md", "shared/")


def fn_in(paths, name):
    pat = re.compile(r"\bfn\s+" + re.escape(name) + r"\b")
    for p in paths:
        try:
            if pat.search(p.read_text(encoding="utf-8")):
                return True
        except OSError:
            pass
    return False


def rust_files_of(parts):
    """Files that can hold module `parts` of src/ (its file, its folder's files)."""
    base = SRC.joinpath(*parts)
    out = []
    if base.with_suffix(".rs").is_file():
        out.append(base.with_suffix(".rs"))
    if base.is_dir():
        out.extend(sorted(base.rglob("*.rs")))
    return out


def py_test_exists(name):
    pat = re.compile(r"\bdef\s+" + re.escape(name) + r"\b")
    for folder in (TESTS / "python", TESTS / "shipped"):
        for p in folder.rglob("*.py"):
            if pat.search(p.read_text(encoding="utf-8")):
                return True
    return False


def expand(span):
    """`a::b::{c, d}` -> [a::b::c, a::b::d]; anything else -> [span]."""
    m = re.fullmatch(r"(.*)::\{([^}]*)\}", span, re.S)
    if not m:
        return [span]
    return [m.group(1) + "::" + x.strip() for x in m.group(2).split(",") if x.strip()]


def check_name(name):
    """None if fine or not a test reference; else the problem."""
    name = " ".join(name.split())
    if "<" in name or name in ("file::fn", "module::tests::fn"):
        return None  # the legend's placeholders
    if name.startswith("tests/"):
        return None if (ROOT / name.split()[0]).exists() else f"{name}: no such path"
    if re.fullmatch(r"test_[a-z0-9_]+", name):
        return None if py_test_exists(name) else f"{name}: no such Python test"
    if not re.fullmatch(r"[a-z_][a-z0-9_]*(::[a-z_][a-z0-9_]*)+", name):
        return None  # a type, a method, a config key: prose
    parts = name.split("::")
    if "tests" in parts:
        i = parts.index("tests")
        files = rust_files_of(parts[:i])
        if not files:
            return f"{name}: no module src/{'/'.join(parts[:i])}"
        if i == len(parts) - 1:
            return None if any("mod tests" in f.read_text(encoding="utf-8") for f in files) \
                else f"{name}: no `mod tests`"
        return None if fn_in(files, parts[-1]) else f"{name}: no unit test `{parts[-1]}`"
    if len(parts) == 2:
        tfile = TESTS / (parts[0] + ".rs")
        tdir = TESTS / parts[0]
        if tfile.is_file() or tdir.is_dir():
            files = ([tfile] if tfile.is_file() else []) + (sorted(tdir.rglob("*.rs")) if tdir.is_dir() else [])
            return None if fn_in(files, parts[1]) else f"{name}: no test `{parts[1]}` in tests/{parts[0]}.rs"
    return None  # a code path (module::item): prose


MAX_FILE_LINES = 900
MAX_FN_LINES = 120
# "path" or "path::fn" -> why splitting it would make it worse. Empty: none is over.
SIZE_EXCEPTIONS = {}
FN_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?(?:const\s+)?(?:unsafe\s+)?fn\s+(\w+)")


def code_of(line):
    """A line without its strings, char literals and comment (enough to count braces)."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split("//")[0]


def sizes():
    """Files and functions of src/ over their bound."""
    out = []
    for f in sorted(SRC.rglob("*.rs")):
        rel = f.relative_to(ROOT).as_posix()
        lines = f.read_text(encoding="utf-8").split("\n")
        if len(lines) > MAX_FILE_LINES and rel not in SIZE_EXCEPTIONS:
            out.append(f"{rel}: {len(lines)} lines (over {MAX_FILE_LINES})")
        for i, line in enumerate(lines):
            m = FN_RE.match(line)
            if not m:
                continue
            depth, opened, j = 0, False, i
            while j < len(lines):
                code = code_of(lines[j])
                for ch in code:
                    if ch == "{":
                        depth, opened = depth + 1, True
                    elif ch == "}":
                        depth -= 1
                if (opened and depth == 0) or (not opened and code.rstrip().endswith(";")):
                    break
                j += 1
            n = j - i + 1
            name = f"{rel}::{m.group(1)}"
            if opened and n > MAX_FN_LINES and name not in SIZE_EXCEPTIONS:
                out.append(f"{name} (line {i + 1}): {n} lines (over {MAX_FN_LINES})")
    return out


def main():
    path = ROOT / "ARCHITECTURE.md"
    text = path.read_text(encoding="utf-8")
    problems = []
    for needle in OUTSIDE:
        for n, line in enumerate(text.splitlines(), 1):
            if needle in line:
                problems.append(f"ARCHITECTURE.md:{n}: cites {needle!r}, outside the repository")
    m = re.search(r"^## Invariants\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        problems.append("ARCHITECTURE.md: no '## Invariants' section")
    else:
        checked = 0
        for span in re.findall(r"`([^`]+)`", m.group(1)):
            for name in expand(span):
                problem = check_name(name)
                checked += 1
                if problem:
                    problems.append("ARCHITECTURE.md invariants: " + problem)
        print(f"archcheck: {checked} names in the invariants looked at", file=sys.stderr)
    problems.extend(sizes())
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print("archcheck: OK", file=sys.stderr)


if __name__ == "__main__":
    main()
