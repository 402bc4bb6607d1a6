//! Exhaustive small scope: every sequence of up to four operations, over two
//! owners and one group with two members (`node/[lockset]`, `node/a`,
//! `node/b`), compared with the [`Reference`] after every step, with the
//! manager's invariants checked after every step.
//!
//! The alphabet, per owner: `try_update` and `update_waiting` between them
//! cover shared, exclusive and release on each of the three locks (waiting
//! requests at priority 0, one also at -1, so the same request re-sent at
//! another priority is covered), a two-entry waiting request, `free_locks`,
//! `free_locks_level(node)`, `downgrade_locks_level(node)`,
//! `intersect_locks`, and both opportunistic unions.
//!
//! The search is depth first. The real manager of every node is rebuilt
//! from nothing by replaying the node's sequence, so every state it is
//! checked in was built by history, never by `restore`; the reference is
//! cloned from the parent node.

use std::sync::atomic::{AtomicUsize, Ordering};

use warden::locks::{Entry, Level, LockManager, Mode, Owner};

use crate::harness::{Op, apply_real, apply_reference, compare_outcomes, compare_states, lock};
use crate::reference::Reference;

/// Longest sequence tried.
const DEPTH_MAX: usize = 4;
/// Operations in the alphabet (checked against [`alphabet`]).
const ALPHABET_SIZE: usize = 2 * 19;

fn owners() -> Vec<Owner> {
    vec![
        Owner::job(1, "/ll/job-1", 101),
        Owner::job(2, "/ll/job-2", 102),
    ]
}

fn alphabet() -> Vec<Op> {
    let (group, a, b) = (lock("node/[lockset]"), lock("node/a"), lock("node/b"));
    let mut ops = Vec::new();
    for owner in 0..owners().len() {
        for entry in [
            Entry::shared(group.clone()),
            Entry::release(group.clone()),
            Entry::exclusive(a.clone()),
            Entry::release(a.clone()),
            Entry::shared(b.clone()),
            Entry::release(b.clone()),
        ] {
            ops.push(Op::TryUpdate {
                owner,
                request: vec![entry],
            });
        }
        for entry in [
            Entry::shared(group.clone()),
            Entry::exclusive(group.clone()),
            Entry::shared(a.clone()),
            Entry::exclusive(a.clone()),
            Entry::exclusive(b.clone()),
        ] {
            ops.push(Op::UpdateWaiting {
                owner,
                priority: 0,
                request: vec![entry],
            });
        }
        ops.push(Op::UpdateWaiting {
            owner,
            priority: -1,
            request: vec![Entry::exclusive(a.clone())],
        });
        ops.push(Op::UpdateWaiting {
            owner,
            priority: 0,
            request: vec![Entry::shared(a.clone()), Entry::exclusive(b.clone())],
        });
        ops.push(Op::FreeLocks { owner });
        ops.push(Op::FreeLocksLevel {
            owner,
            level: Level::Node,
        });
        ops.push(Op::Downgrade {
            owner,
            level: Level::Node,
        });
        ops.push(Op::Intersect {
            owner,
            keep: vec![a.clone()],
        });
        ops.push(Op::Union {
            owner,
            wanted: vec![(b.clone(), Mode::Exclusive), (a.clone(), Mode::Exclusive)],
        });
        ops.push(Op::Guarded {
            count: 2,
            owner,
            wanted: vec![(a.clone(), Mode::Shared), (b.clone(), Mode::Shared)],
        });
    }
    ops
}

struct Scope {
    owners: Vec<Owner>,
    alphabet: Vec<Op>,
}

/// Checks the sequence `path` (its last operation applied to the state its
/// prefix built), then every extension of it up to [`DEPTH_MAX`]. Answers
/// how many sequences were checked.
fn visit(scope: &Scope, path: &mut Vec<usize>, parent: &Reference) -> usize {
    let (last, prefix) = path.split_last().expect("a path has an operation");
    let mut real = LockManager::new();
    for index in prefix {
        apply_real(&mut real, &scope.alphabet[*index], &scope.owners);
    }
    let op = &scope.alphabet[*last];
    let mut reference = parent.clone();
    let have = apply_real(&mut real, op, &scope.owners);
    let want = apply_reference(&mut reference, op, &scope.owners);
    real.check_invariants();
    if let Err(message) = compare_outcomes(&have, &want)
        .and_then(|()| compare_states(&real, &reference, &scope.owners))
    {
        let sequence: Vec<&Op> = path.iter().map(|index| &scope.alphabet[*index]).collect();
        panic!(
            "owners {:?}; sequence {sequence:?}: {message}",
            scope.owners
        );
    }
    let mut checked = 1;
    if path.len() < DEPTH_MAX {
        for next in 0..scope.alphabet.len() {
            path.push(next);
            checked += visit(scope, path, &reference);
            path.pop();
        }
    }
    checked
}

#[test]
fn every_sequence_of_up_to_four_operations_agrees_with_the_reference() {
    let scope = Scope {
        owners: owners(),
        alphabet: alphabet(),
    };
    assert_eq!(scope.alphabet.len(), ALPHABET_SIZE);
    let workers = std::thread::available_parallelism().map_or(1, |count| count.get());
    let next_first = AtomicUsize::new(0);
    let checked = AtomicUsize::new(0);
    std::thread::scope(|threads| {
        for _ in 0..workers {
            threads.spawn(|| {
                loop {
                    let first = next_first.fetch_add(1, Ordering::Relaxed);
                    if first >= scope.alphabet.len() {
                        break;
                    }
                    let count = visit(&scope, &mut vec![first], &Reference::new());
                    checked.fetch_add(count, Ordering::Relaxed);
                }
            });
        }
    });
    let expected: usize = (1..=DEPTH_MAX as u32)
        .map(|depth| ALPHABET_SIZE.pow(depth))
        .sum();
    assert_eq!(checked.into_inner(), expected);
}
