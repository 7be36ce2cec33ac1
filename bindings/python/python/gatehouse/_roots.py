"""Roots a harness sets for a registration (MCP `Root`), in the shape the gateway takes."""

from __future__ import annotations

from typing import Any, Iterable, Mapping


def roots_list(roots: Iterable[Any]) -> list[dict[str, Any]]:
    """``roots`` as the gateway takes them: ``[{"uri": ..., "name": ...}]``. Each item is a
    mapping with ``uri`` (and optionally ``name``), a ``(uri, name)`` pair or a URI string."""
    if isinstance(roots, (str, bytes, Mapping)):
        raise TypeError("roots must be a list of roots, e.g. [{'uri': 'file:///work', 'name': 'work'}]")
    out: list[dict[str, Any]] = []
    for r in roots:
        if isinstance(r, str):
            out.append({"uri": r})
        elif isinstance(r, Mapping):
            out.append(dict(r))
        elif isinstance(r, (tuple, list)) and len(r) == 2:
            uri, name = r
            out.append({"uri": uri} if name is None else {"uri": uri, "name": name})
        else:
            raise TypeError(f"a root is a {{'uri', 'name'}} mapping, a (uri, name) pair or a URI string, not {r!r}")
    return out
