//! The two-level all-to-all over MPI: runs the schedule of [`crate::hosts::TwoLevel`] on a
//! group's communicator, each step as non-blocking point-to-point messages (one tag per
//! step), all posted before any is waited for. Within a host the messages go through
//! OpenMPI's shared-memory transport; only step 1 crosses hosts.

use crate::hosts::{Block, TwoLevel, STEPS};
use crate::Traffic;
use mpi::request::{scope, WaitGuard};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, Destination as _, Source as _};
use std::collections::HashMap;

/// Where a held block lies: in the caller's send buffer, or in a received message.
#[derive(Clone, Copy)]
enum At {
    Send(usize),
    Got(usize, usize),
}

/// The all-to-all of `send` (the k blocks of `piece` bytes for group ranks 0..k, back to
/// back) for group rank `me`: returns the k blocks received from ranks 0..k, back to back,
/// exactly what a flat exchange returns. Adds the messages that crossed hosts to `traffic`.
pub(crate) fn all_to_all(
    c: &SimpleCommunicator,
    plan: &TwoLevel,
    me: usize,
    send: &[u8],
    piece: usize,
    traffic: &mut Traffic,
) -> Vec<u8> {
    let k = c.size() as usize;
    let mut at: HashMap<Block, At> = (0..k)
        .map(|d| (Block { src: me, dst: d }, At::Send(d * piece)))
        .collect();
    let mut got: Vec<Vec<u8>> = Vec::new();
    for step in 0..STEPS {
        let sends = plan.sends(step, me);
        let recvs = plan.recvs(step, me);
        let out: Vec<Vec<u8>> = sends
            .iter()
            .map(|(_, blocks)| {
                let mut m = Vec::with_capacity(blocks.len() * piece);
                for b in blocks {
                    m.extend_from_slice(held(&at, &got, send, *b, piece));
                }
                m
            })
            .collect();
        for ((peer, _), m) in sends.iter().zip(&out) {
            if plan.remote(me, *peer) && !m.is_empty() {
                traffic.inter_host_messages += 1;
                traffic.inter_host_bytes += m.len() as u64;
            }
        }
        let mut inb: Vec<Vec<u8>> = recvs
            .iter()
            .map(|(_, blocks)| vec![0u8; blocks.len() * piece])
            .collect();
        if piece > 0 {
            let tag = step as i32 + 1;
            scope(|sc| {
                let mut guards = Vec::with_capacity(sends.len() + recvs.len());
                for ((peer, _), buf) in recvs.iter().zip(inb.iter_mut()) {
                    let p = c.process_at_rank(*peer as i32);
                    guards.push(WaitGuard::from(p.immediate_receive_into_with_tag(
                        sc,
                        &mut buf[..],
                        tag,
                    )));
                }
                for ((peer, _), m) in sends.iter().zip(&out) {
                    let p = c.process_at_rank(*peer as i32);
                    guards.push(WaitGuard::from(p.immediate_send_with_tag(sc, &m[..], tag)));
                }
                drop(guards);
            });
        }
        for ((_, blocks), buf) in recvs.iter().zip(inb) {
            let id = got.len();
            for (i, b) in blocks.iter().enumerate() {
                at.insert(*b, At::Got(id, i * piece));
            }
            got.push(buf);
        }
    }
    let mut result = Vec::with_capacity(k * piece);
    for s in 0..k {
        result.extend_from_slice(held(&at, &got, send, Block { src: s, dst: me }, piece));
    }
    result
}

/// The bytes of held block `b`.
fn held<'a>(
    at: &HashMap<Block, At>,
    got: &'a [Vec<u8>],
    send: &'a [u8],
    b: Block,
    piece: usize,
) -> &'a [u8] {
    match at[&b] {
        At::Send(o) => &send[o..o + piece],
        At::Got(i, o) => &got[i][o..o + piece],
    }
}
