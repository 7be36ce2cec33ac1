#!/usr/bin/env python3
"""The MCP Python SDK 1.x bug behind the tasks conformance run's stalls, and the fixture's fix.

Run with tests/peers/.venv-mcp1/bin/python (run.sh tasks does, before the scenarios):

    responder_check.py [FIXTURE]     (default: tests/fixtures/task_server.py)

A request handler runs inside `with responder:` in a child of the task group that `Server.run`
reads its messages in. `notifications/cancelled` for that request arrives after the handler
returned, while its answer is being written (the sleep below stands for `respond()`'s send).
`RequestResponder.cancel()` cancels the request's scope; the scope's `__exit__` swallows its own
cancellation, but the SDK's `RequestResponder.__exit__` drops that verdict, so the
`CancelledError` escapes, the child ends cancelled, and anyio's task group cancels itself: the
server's message loop ends while its transport is still open (docs/conformance.md, "Tasks").

1. With the SDK as installed, the group must cancel itself (the bug is there, so the fixture's
   workaround is still needed; if this fails, the SDK fixed it: drop the workaround).
2. After importing FIXTURE (which patches `RequestResponder.__exit__`), it must not.
"""

import importlib.util
import sys
from pathlib import Path

import anyio
from mcp.shared.session import RequestResponder


class _Session:
    async def _send_response(self, request_id, response):
        await anyio.lowlevel.checkpoint()


async def _group_cancels_itself() -> bool:
    responder = RequestResponder(
        request_id=7, request_meta=None, request=None, session=_Session(), on_complete=lambda r: None
    )
    entered = anyio.Event()

    async def handler():
        with responder:
            entered.set()
            await anyio.sleep(0.05)  # the handler returned; its answer is being written

    async with anyio.create_task_group() as tg:
        tg.start_soon(handler)
        await entered.wait()
        await responder.cancel()  # notifications/cancelled arrives now
        await anyio.sleep(0.2)  # the message loop goes on receiving here
    return tg.cancel_scope.cancel_called


def main() -> int:
    root = Path(__file__).resolve().parents[2]
    fixture = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "tests/fixtures/task_server.py"
    if not anyio.run(_group_cancels_itself):
        print("responder_check: the installed SDK no longer leaks the cancellation out of "
              "RequestResponder.__exit__; drop the workaround in task_server.py")
        return 1
    spec = importlib.util.spec_from_file_location("task_server_fixture", fixture)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if anyio.run(_group_cancels_itself):
        print(f"responder_check: FAIL: with {fixture.name} loaded, a request cancelled while its "
              "answer is written still cancels the server's message loop")
        return 1
    print("responder_check: the SDK's cancelled-request leak is there, and the fixture stops it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
