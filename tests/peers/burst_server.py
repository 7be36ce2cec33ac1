"""An upstream written with fastmcp 4.x (tests/peers/.venv-fastmcp) that bursts notifications.

    .venv-fastmcp/bin/python burst_server.py            # stdio

Tools:
  burst {n=1000}   sends n progress notifications (progress=1..n, total=n, message "p<i>") and n
                   log messages (info, data "l<i>"), alternating, as fast as the transport takes
                   them, then returns "sent <n>". The gateway must deliver all 2n, in order.
  echo {message}   returns the message.
"""

from fastmcp import Context, FastMCP

mcp = FastMCP("gatehouse-burst")


@mcp.tool
async def burst(ctx: Context, n: int = 1000) -> str:
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"p{i}")
        await ctx.info(f"l{i}")
    return f"sent {n}"


@mcp.tool
def echo(message: str) -> str:
    return message


if __name__ == "__main__":
    mcp.run("stdio", show_banner=False)
