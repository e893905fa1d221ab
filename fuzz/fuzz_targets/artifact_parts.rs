//! Peer input to artifact threads: the `data` of a command part (a host parses and applies
//! it for a guest) and of event parts (a replica applies the host's events). Neither may
//! panic, and a replica's state must still serialize (it is what the node snapshots).
#![no_main]

use awp_node::artifact::{
    apply, parse_command_frame, Actor, CapSet, Context, EventEnvelope, Replica, SeededIds,
    Workspace,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    // One JSON value per line: the first lines as commands from a guest with every cap, the
    // rest as events offered to a replica.
    let mut ws = Workspace::new("thr_fuzz");
    let mut replica = Replica::new("thr_fuzz");
    let mut ids = SeededIds(7);
    for (i, line) in data.split(|b| *b == b'\n').take(64).enumerate() {
        let Ok(v) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        if i % 2 == 0 {
            if let Ok(frame) = parse_command_frame(&v) {
                let mut ctx = Context {
                    actor: Actor::ExternalAgent {
                        client_id: "guest".into(),
                        name: None,
                    },
                    caps: if i % 4 == 0 { CapSet::all() } else { CapSet::none() },
                    now_us: 1_700_000_000_000_000,
                    ids: &mut ids,
                };
                let (_, events) = apply(&mut ws, &mut ctx, &frame);
                for e in events {
                    let _ = replica.receive(e);
                }
            }
        } else if let Ok(env) = serde_json::from_value::<EventEnvelope>(v) {
            let _ = replica.receive(env);
        }
    }
    serde_json::to_string(&replica.state).expect("replica state serializes");
});
