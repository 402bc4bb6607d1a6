//! The queue core ([`warden::luxid::core::QueueCore`]) against the naive
//! [`Model`] of [`crate::queue_reference`]: random step sequences
//! (proptest), and an exhaustive small scope over the interleavings of
//! cancel, priority change and runner death for two jobs. Replies and the
//! observable queue (statuses, started jobs, queue order, starts in order)
//! are compared after every step; the core's invariants are checked after
//! every input.

use proptest::prelude::*;
use warden::jobs::opcode;

use crate::queue_reference::{Model, Step, World, compare};

const PRIORITIES: [i64; 3] = opcode::SUBMIT_PRIORITIES;

fn submit_strategy() -> impl Strategy<Value = Step> {
    (
        prop::sample::select(&PRIORITIES[..]),
        prop::collection::vec(1..=9u64, 0..3),
    )
        .prop_map(|(priority, depends)| Step::Submit { priority, depends })
}

/// What a runner does.
fn runner_strategy() -> impl Strategy<Value = Step> {
    let id = 1..=10u64;
    prop_oneof![
        id.clone().prop_map(|id| Step::Run { id }),
        (id.clone(), any::<bool>()).prop_map(|(id, success)| Step::Finish { id, success }),
        id.prop_map(|id| Step::Die { id }),
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    let id = 1..=10u64;
    prop_oneof![
        4 => submit_strategy(),
        2 => (id.clone(), any::<bool>()).prop_map(|(id, kill)| Step::Cancel { id, kill }),
        2 => (id.clone(), prop::sample::select(&PRIORITIES[..]))
            .prop_map(|(id, priority)| Step::ChangePriority { id, priority }),
        1 => id.prop_map(|id| Step::Archive { id }),
        1 => any::<bool>().prop_map(Step::SetDrain),
        1 => any::<bool>().prop_map(Step::DiskFull),
        8 => runner_strategy(),
        1 => Just(Step::Restart),
        // A runner's end and a submission in the same turn: the room it
        // leaves is shared between the new job and the queued ones.
        2 => (runner_strategy(), submit_strategy())
            .prop_map(|(first, second)| Step::Together(Box::new(first), Box::new(second))),
    ]
}

/// Runs `steps` on both, comparing after each.
fn run(max_running_jobs: usize, steps: &[Step]) {
    let mut model = Model::new(max_running_jobs);
    let mut world = World::new(max_running_jobs);
    for step in steps {
        // A dependency names an earlier job (or none at all).
        let step = earlier_dependencies(step, model.serial);
        let expected = model.step(&step);
        let seen = world.step(&step);
        compare(&model, &world, (&expected, &seen), &step);
    }
}

/// `step` with the dependencies of its submission on jobs up to `serial`
/// only.
fn earlier_dependencies(step: &Step, serial: u64) -> Step {
    match step {
        Step::Submit { priority, depends } => Step::Submit {
            priority: *priority,
            depends: depends
                .iter()
                .copied()
                .filter(|dep| *dep <= serial)
                .collect(),
        },
        Step::Together(first, second) => Step::Together(
            Box::new(earlier_dependencies(first, serial)),
            Box::new(earlier_dependencies(second, serial)),
        ),
        other => other.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_queue_core_matches_the_model(
        max_running_jobs in 1usize..=3,
        steps in prop::collection::vec(step_strategy(), 1..40),
    ) {
        run(max_running_jobs, &steps);
    }
}

/// Two started jobs (one run by a previous luxid when `restarted`), and
/// every sequence of up to four events over both: cancel with and without
/// kill, a priority change, a death, and (the runner's own) run.
#[test]
fn every_interleaving_of_cancel_priority_and_death_for_two_jobs() {
    let mut alphabet = Vec::new();
    for id in [1, 2] {
        alphabet.push(Step::Cancel { id, kill: false });
        alphabet.push(Step::Cancel { id, kill: true });
        alphabet.push(Step::ChangePriority { id, priority: -10 });
        alphabet.push(Step::Die { id });
        alphabet.push(Step::Run { id });
    }
    let mut checked = 0;
    for restarted in [false, true] {
        for max_running_jobs in [1, 2] {
            let mut prefix = vec![
                Step::Submit {
                    priority: 0,
                    depends: vec![],
                },
                Step::Submit {
                    priority: 0,
                    depends: vec![],
                },
            ];
            if restarted {
                prefix.push(Step::Restart);
            }
            let mut sequence = Vec::new();
            checked += exhaust(max_running_jobs, &prefix, &alphabet, &mut sequence, 4);
        }
    }
    // 10 + 10^2 + 10^3 + 10^4 sequences (and the empty one), per setup.
    assert_eq!(checked, 4 * 11_111);
}

fn exhaust(
    max_running_jobs: usize,
    prefix: &[Step],
    alphabet: &[Step],
    sequence: &mut Vec<Step>,
    depth: usize,
) -> usize {
    let steps: Vec<Step> = prefix.iter().chain(sequence.iter()).cloned().collect();
    run(max_running_jobs, &steps);
    let mut checked = 1;
    if depth == 0 {
        return checked;
    }
    for step in alphabet {
        sequence.push(step.clone());
        checked += exhaust(max_running_jobs, prefix, alphabet, sequence, depth - 1);
        sequence.pop();
    }
    checked
}
