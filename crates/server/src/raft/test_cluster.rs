//! In-memory raft-rs members for unit tests: three voters on
//! `MemStorage` with the server's raft settings, and one Ready handled
//! the way the raft thread handles it.

use raft::eraftpb::{ConfState, Message};
use raft::storage::MemStorage;
use raft::{RawNode, ReadState, StateRole};

/// Member `id` of an in-memory cluster of voters 1, 2, 3, configured as
/// the server configures raft (pre-vote on, 10 ticks to an election).
pub fn node(id: u64) -> RawNode<MemStorage> {
    let storage = MemStorage::new_with_conf_state(ConfState::from((vec![1, 2, 3], vec![])));
    let cfg = raft::Config {
        election_tick: 10,
        pre_vote: true,
        ..super::base_config(id)
    };
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    RawNode::new(&cfg, storage, &logger).expect("raft node")
}

/// One Ready of `n`, persisted and applied; `after` gets its read states
/// and the applied index once it is applied. Returns the messages it sends.
pub fn ready(n: &mut RawNode<MemStorage>, after: impl FnOnce(Vec<ReadState>, u64)) -> Vec<Message> {
    let mut out = Vec::new();
    if !n.has_ready() {
        return out;
    }
    let mut rd = n.ready();
    out.extend(rd.take_messages());
    n.mut_store().wl().append(rd.entries()).expect("append");
    if let Some(hs) = rd.hs() {
        n.mut_store().wl().set_hardstate(hs.clone());
    }
    out.extend(rd.take_persisted_messages());
    let read_states = rd.take_read_states();
    let mut light = n.advance(rd);
    if let Some(commit) = light.commit_index() {
        n.mut_store().wl().mut_hard_state().set_commit(commit);
    }
    out.extend(light.take_messages());
    n.advance_apply();
    after(read_states, n.raft.raft_log.applied);
    out
}

/// Delivers messages between the members (each through
/// `commit_notice::step`, as the raft thread steps them) until none is
/// left; returns every message delivered.
pub fn pump(nodes: &mut [RawNode<MemStorage>], mut msgs: Vec<Message>) -> Vec<Message> {
    let mut seen = Vec::new();
    for _ in 0..100 {
        for n in nodes.iter_mut() {
            msgs.extend(ready(n, |_, _| {}));
        }
        if msgs.is_empty() {
            return seen;
        }
        for m in std::mem::take(&mut msgs) {
            seen.push(m.clone());
            let _ = super::commit_notice::step(&mut nodes[m.to as usize - 1], m);
        }
    }
    panic!("the cluster did not settle");
}

/// Three members with member 1 the leader, every log caught up.
pub fn cluster() -> Vec<RawNode<MemStorage>> {
    let mut nodes: Vec<_> = (1..=3).map(node).collect();
    nodes[0].campaign().expect("campaign");
    pump(&mut nodes, Vec::new());
    assert_eq!(nodes[0].raft.state, StateRole::Leader);
    nodes
}
