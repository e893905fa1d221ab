"""An ACP agent built on the official Python SDK (`agent-client-protocol` on PyPI): every
protocol message is the SDK's; this file only says what to answer. It echoes each
prompt's text back as agent message chunks and ends the turn. Used by
scripts/acp/interop.sh to check `awp serve-agent --acp` against an agent the project did
not implement."""

import asyncio

from acp import (
    PROTOCOL_VERSION,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    text_block,
    update_agent_message,
)
from acp.schema import AgentCapabilities


class EchoAgent:
    def on_connect(self, conn):
        self._conn = conn
        self._n = 0

    async def initialize(self, protocol_version, client_capabilities=None, client_info=None, **kwargs):
        return InitializeResponse(protocol_version=PROTOCOL_VERSION, agent_capabilities=AgentCapabilities())

    async def new_session(self, cwd, mcp_servers=None, **kwargs):
        self._n += 1
        return NewSessionResponse(session_id=f"py-{self._n}")

    async def prompt(self, session_id, prompt, **kwargs):
        for block in prompt:
            text = getattr(block, "text", None)
            if text is not None:
                await self._conn.session_update(
                    session_id=session_id, update=update_agent_message(text_block("py-echo: " + text))
                )
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id, **kwargs):
        return None


if __name__ == "__main__":
    asyncio.run(run_agent(EchoAgent()))
