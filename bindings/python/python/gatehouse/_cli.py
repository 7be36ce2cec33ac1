"""The ``gatehouse`` command of the wheel: every CLI verb, ``serve`` included, runs in the
native module (the library the embedded API uses), so a ``pip install`` of the wheel gives the
daemon with no Rust toolchain and no second binary. ``python -m gatehouse`` is the same."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import sysconfig

from . import _native


def self_exe() -> str | None:
    """The ``gatehouse`` command an ``@self`` upstream runs: ``$GATEHOUSE_SELF_EXE``, else this
    installation's console script, else ``gatehouse`` on ``PATH``."""
    exe = os.environ.get("GATEHOUSE_SELF_EXE")
    if exe:
        return exe
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "gatehouse" and os.access(argv0, os.X_OK):
        return os.path.abspath(argv0)
    script = os.path.join(sysconfig.get_path("scripts"), "gatehouse")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return script
    return shutil.which("gatehouse")


def shipped_config() -> str | None:
    """The config a bare ``gatehouse serve`` of the wheel reads: the repository's
    ``config/gatehouse.toml`` (every key at its default), packaged beside this module. Used when
    the command line names no ``--config``, ``GATEHOUSE_CONFIG`` is unset and there is no
    ``config/gatehouse.toml`` here (where the binary looks)."""
    args = sys.argv[1:]
    if os.environ.get("GATEHOUSE_CONFIG") or any(
        a == "--config" or a.startswith("--config=") for a in args
    ):
        return None
    if os.path.exists(os.path.join("config", "gatehouse.toml")):
        return None
    shipped = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gatehouse.toml")
    return shipped if os.path.isfile(shipped) else None


def main() -> int:
    # The verbs handle SIGINT themselves (the daemon stops cleanly; a second one forces): the
    # interpreter's handler would also raise KeyboardInterrupt once the verb returns.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # `command = "@self"` must name this command, not the Python interpreter (set before the
    # native code starts any thread).
    exe = self_exe()
    if exe and not os.environ.get("GATEHOUSE_SELF_EXE"):
        os.environ["GATEHOUSE_SELF_EXE"] = exe
    config = shipped_config()
    if config:
        os.environ["GATEHOUSE_CONFIG"] = config
    return _native.main(["gatehouse", *sys.argv[1:]])
