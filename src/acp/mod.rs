//! Agent Client Protocol (ACP) bridges (issue 11 §2, §3), built on the official
//! `agent-client-protocol` crate. Both drive the node through its control socket, like
//! the CLI verbs.
//!
//! Layout:
//! - [`bridge`]: the pure mapping between AWP msgs/states and ACP prompts/updates.
//! - [`linecap`]: the cap on the agent's output lines used by [`serve`].
//! - [`lock`]: one `serve-agent` per node home.
//! - [`serve`]: `awp serve-agent --acp -- CMD…`, a local ACP agent served to remote peers
//!   (the node is the ACP client).
//! - [`agent`]: `awp acp --peer PEER`, an ACP agent for an editor whose prompts go to
//!   PEER's served agent.

pub mod agent;
pub mod bridge;
pub mod cli;
pub mod linecap;
pub mod lock;
pub mod serve;
