"""An ACP client built on the official Python SDK (`agent-client-protocol` on PyPI): it
starts `awp acp --peer PEER` as its agent (as an editor would), opens a session, sends one
prompt, prints the agent's message chunks and checks the stop reason. Usage:
python3 py_client.py EXPECTED_TEXT -- awp --home HOME acp --peer PEER"""

import asyncio
import os
import sys

from acp import PROTOCOL_VERSION, connect_to_agent, text_block
from acp.schema import ClientCapabilities, Implementation


class Editor:
    def __init__(self):
        self.text = ""

    def on_connect(self, conn):
        pass

    async def session_update(self, session_id, update, **kwargs):
        content = getattr(update, "content", None)
        if getattr(content, "text", None):
            self.text += content.text

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        raise NotImplementedError("no permission expected")


async def main():
    sep = sys.argv.index("--")
    expected, cmd = sys.argv[1], sys.argv[sep + 1 :]
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    editor = Editor()
    conn = connect_to_agent(editor, proc.stdin, proc.stdout)
    await conn.initialize(
        protocol_version=PROTOCOL_VERSION,
        client_capabilities=ClientCapabilities(),
        client_info=Implementation(name="acp-py-client", version="0"),
    )
    session = await conn.new_session(cwd=os.getcwd(), mcp_servers=[])
    resp = await asyncio.wait_for(
        conn.prompt(session_id=session.session_id, prompt=[text_block(expected)]), 60
    )
    print(f"stop_reason={resp.stop_reason} text={editor.text!r}")
    proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except asyncio.TimeoutError:
        proc.kill()
    ok = resp.stop_reason == "end_turn" and expected in editor.text
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    asyncio.run(main())
