#!/usr/bin/env python3
"""Compares a conformance run directly against the upstream with one through the gateway.

compare.py NAME DIRECT.txt GATEWAY.txt BASELINE.yml GATEWAY_EXIT_CODE

Prints a Markdown table (scenario, direct, gateway, baseline) and exits 1 if:
- the suite itself failed the gateway run (an unexpected failure or a stale baseline entry);
- a scenario fails through the gateway, is not baselined, whatever it did directly;
- a baseline entry passes through the gateway (stale: the baseline only shrinks);
- a baseline entry names a scenario the suite did not run (typo or removed scenario).
"""
import re
import sys

LINE = re.compile(r"^[✓✗]\s+(\S+):\s+(\d+) passed, (\d+) failed")


def summary(path):
    res = {}
    with open(path, encoding="utf-8") as f:
        text = f.read()
    part = text.split("=== SUMMARY ===", 1)
    if len(part) != 2:
        return None
    for line in part[1].splitlines():
        m = LINE.match(line.strip())
        if m:
            res[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return res


def baseline(path):
    names = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].rstrip()
            m = re.match(r"^\s+-\s+(\S+)\s*$", line)
            if m:
                names.append(m.group(1))
    return names


def main():
    name, direct_p, gw_p, base_p, gw_rc = sys.argv[1:6]
    direct, gw, base = summary(direct_p), summary(gw_p), baseline(base_p)
    problems = []
    if direct is None:
        problems.append(f"the direct run printed no summary (see {direct_p})")
        direct = {}
    if gw is None:
        problems.append(f"the gateway run printed no summary (see {gw_p})")
        gw = {}
    ok = lambda r: r is not None and r[1] == 0
    fmt = lambda r: "—" if r is None else f"{'pass' if r[1] == 0 else 'FAIL'} ({r[0]}/{r[0] + r[1]})"
    print(f"### conformance `{name}`\n")
    print("| scenario | direct | through gatehouse | baseline |")
    print("|---|---|---|---|")
    for s in sorted(set(direct) | set(gw), key=lambda s: (list(gw).index(s) if s in gw else 999, s)):
        d, g = direct.get(s), gw.get(s)
        print(f"| {s} | {fmt(d)} | {fmt(g)} | {'listed' if s in base else ''} |")
        if s in gw and not ok(g) and s not in base:
            problems.append(f"{s}: fails through the gateway and is not in the baseline")
        if s in gw and ok(g) and s in base:
            problems.append(f"{s}: passes through the gateway but is listed in the baseline (stale: remove it)")
    for s in base:
        if s not in gw:
            problems.append(f"{s}: in the baseline but not run by the suite")
    dp = sum(1 for r in direct.values() if ok(r))
    gp = sum(1 for r in gw.values() if ok(r))
    both = sum(1 for s, r in direct.items() if ok(r) and ok(gw.get(s)))
    print(f"\nscenarios passing: direct {dp}/{len(direct)}, through gatehouse {gp}/{len(gw)}; "
          f"passing directly and through gatehouse: {both}; baseline entries: {len(base)}")
    if gw_rc != "0" and not problems:
        problems.append(f"the suite exited {gw_rc} on the gateway run (see {gw_p})")
    for p in problems:
        print(f"- PROBLEM: {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
