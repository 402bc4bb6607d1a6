use std::collections::{BTreeMap, BTreeSet};

use super::*;

fn caps(uuid: &str, more: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut caps: BTreeMap<String, String> = more
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect();
    caps.insert(UUID_CAP.to_owned(), uuid.to_owned());
    caps
}

fn groups(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|name| name.to_string()).collect()
}

/// A registry with checked invariants after every change.
struct Farm {
    registry: Registry,
    now: f64,
}

impl Farm {
    fn new() -> Farm {
        Farm {
            registry: Registry::new(),
            now: 100.0,
        }
    }

    fn tick(&mut self) -> f64 {
        self.now += 1.0;
        self.now
    }

    fn checked<T>(&mut self, result: T) -> T {
        self.registry.check_invariants();
        result
    }

    fn register(&mut self, uuid: &str, prepare: Option<&[&str]>) -> Vec<Effect> {
        let now = self.tick();
        let prepare = prepare.map(|argv| argv.iter().map(|arg| arg.to_string()).collect());
        let effects = self
            .registry
            .register(caps(uuid, &[]), Some(groups(&["farm"])), None, prepare, now)
            .expect("registered");
        self.checked(effects)
    }

    fn state(&mut self, uuid: &str, state: &str, kill: bool) -> Result<Vec<Effect>, WorkerError> {
        let now = self.tick();
        let result = self.registry.set_state(uuid, state, kill, now);
        self.checked(result)
    }

    fn fail(&mut self, uuid: &str, reason: &str) -> Result<Vec<Effect>, WorkerError> {
        let now = self.tick();
        let result = self.registry.set_fail(uuid, reason, now);
        self.checked(result)
    }

    fn idle(&mut self, uuid: &str) {
        self.register(uuid, None);
        let effects = self.state(uuid, "IDLE", false).expect("to IDLE");
        assert_eq!(effects, vec![idle(uuid)]);
    }

    fn assign(&mut self, job: JobId, uuids: &[&str]) {
        let now = self.tick();
        let uuids: Vec<String> = uuids.iter().map(|uuid| uuid.to_string()).collect();
        self.registry.assign(job, &uuids, now).expect("assigned");
        self.registry.check_invariants();
    }

    fn release(&mut self, job: JobId, status: &str) -> Vec<Effect> {
        let now = self.tick();
        let effects = self.registry.release(job, status, now);
        self.checked(effects)
    }

    fn state_of(&self, uuid: &str) -> State {
        self.registry.get(uuid).expect("registered").state
    }
}

fn idle(uuid: &str) -> Effect {
    Effect::Idle {
        uuid: uuid.to_owned(),
    }
}

fn prepare(uuid: &str) -> Effect {
    Effect::Prepare {
        uuid: uuid.to_owned(),
        seq: 1,
        argv: vec!["/bin/reset".to_owned()],
    }
}

#[test]
fn a_new_worker_starts_in_maintenance_and_needs_its_uuid() {
    let mut farm = Farm::new();
    assert_eq!(farm.register("b1", None), vec![]);
    assert_eq!(farm.state_of("b1"), State::Maintenance);
    let missing = farm
        .registry
        .register(BTreeMap::new(), None, None, None, 1.0);
    assert_eq!(missing, Err(WorkerError::MissingUuid));
    assert_eq!(
        WorkerError::MissingUuid.to_string(),
        "Capabilities are missing UUID entry"
    );
    assert_eq!(farm.registry.len(), 1);
}

#[test]
fn maintenance_to_idle_goes_through_prepare() {
    let mut farm = Farm::new();
    farm.register("b1", Some(&["/bin/reset"]));
    assert_eq!(farm.state("b1", "IDLE", false), Ok(vec![prepare("b1")]));
    assert_eq!(farm.state_of("b1"), State::Prepare);
    // Asked again while preparing: unchanged, success.
    assert_eq!(farm.state("b1", "IDLE", false), Ok(vec![]));
    let now = farm.tick();
    assert_eq!(
        farm.registry.prepared("b1", 1, Ok(()), now),
        vec![idle("b1")]
    );
    assert_eq!(farm.state_of("b1"), State::Idle);
}

#[test]
fn a_failed_prepare_fails_the_worker_with_its_reason() {
    let mut farm = Farm::new();
    farm.register("b1", Some(&["/bin/reset"]));
    farm.state("b1", "IDLE", false).expect("to PREPARE");
    let now = farm.tick();
    assert_eq!(
        farm.registry
            .prepared("b1", 1, Err("exit status 3".to_owned()), now),
        vec![Effect::Failed {
            uuid: "b1".to_owned()
        }]
    );
    let worker = farm.registry.get("b1").expect("registered");
    assert_eq!(worker.state, State::Failed);
    assert_eq!(
        worker.fail_reason.as_deref(),
        Some("prepare failed: exit status 3")
    );
}

#[test]
fn to_idle_is_refused_from_every_state_but_maintenance_and_prepare() {
    let mut farm = Farm::new();
    farm.idle("b1");
    assert_eq!(
        farm.state("b1", "IDLE", false),
        Err(WorkerError::InvalidTransition)
    );
    farm.assign(1, &["b1"]);
    assert_eq!(
        farm.state("b1", "IDLE", false),
        Err(WorkerError::InvalidTransition)
    );
    farm.state("b1", "MAINTENANCE", false).expect("to BUSY");
    assert_eq!(farm.state_of("b1"), State::Busy);
    assert_eq!(
        farm.state("b1", "IDLE", false),
        Err(WorkerError::InvalidTransition)
    );
    farm.idle("b2");
    farm.fail("b2", "smoke").expect("failed");
    assert_eq!(
        farm.state("b2", "IDLE", false),
        Err(WorkerError::InvalidTransition)
    );
}

#[test]
fn only_idle_and_maintenance_may_be_asked_for_before_the_lookup() {
    let mut farm = Farm::new();
    for state in ["RUNNING", "FAILED", "PREPARE", "BUSY", "idle", ""] {
        assert_eq!(
            farm.state("nobody", state, false),
            Err(WorkerError::OnlyIdleOrMaintenance)
        );
    }
    assert_eq!(
        farm.state("nobody", "IDLE", false),
        Err(WorkerError::NotFound)
    );
    assert_eq!(
        WorkerError::OnlyIdleOrMaintenance.to_string(),
        "Only state changes to IDLE and MAINTENANCE are allowed"
    );
}

#[test]
fn maintenance_of_a_held_worker_waits_for_its_holder() {
    let mut farm = Farm::new();
    farm.register("b1", Some(&["/bin/reset"]));
    farm.state("b1", "IDLE", false).expect("to PREPARE");
    let now = farm.tick();
    farm.registry.prepared("b1", 1, Ok(()), now);
    farm.assign(7, &["b1"]);
    assert_eq!(farm.state("b1", "MAINTENANCE", false), Ok(vec![]));
    assert_eq!(farm.state_of("b1"), State::Busy);
    // Asked again: unchanged, success.
    assert_eq!(farm.state("b1", "MAINTENANCE", false), Ok(vec![]));
    // The holder ends: MAINTENANCE, not PREPARE.
    assert_eq!(farm.release(7, "success"), vec![]);
    let worker = farm.registry.get("b1").expect("registered");
    assert_eq!(worker.state, State::Maintenance);
    assert_eq!(worker.holder, None);
    assert_eq!(worker.history.len(), 1);
    assert_eq!(worker.history[0].job, 7);
    assert_eq!(worker.history[0].status, "success");
}

#[test]
fn maintenance_with_kill_ends_the_holder() {
    let mut farm = Farm::new();
    farm.idle("b1");
    farm.assign(7, &["b1"]);
    assert_eq!(
        farm.state("b1", "MAINTENANCE", true),
        Ok(vec![Effect::EndJob {
            job: 7,
            reason: "worker b1 was put in MAINTENANCE".to_owned()
        }])
    );
    assert_eq!(farm.state_of("b1"), State::Busy);
}

#[test]
fn fail_kills_the_holder_and_is_forbidden_in_maintenance() {
    let mut farm = Farm::new();
    farm.register("b1", None);
    assert_eq!(
        farm.fail("b1", "smoke"),
        Err(WorkerError::FailInMaintenance)
    );
    farm.state("b1", "IDLE", false).expect("to IDLE");
    farm.assign(9, &["b1"]);
    assert_eq!(
        farm.fail("b1", "no power"),
        Ok(vec![
            Effect::EndJob {
                job: 9,
                reason: "worker b1 failed: no power".to_owned()
            },
            Effect::Failed {
                uuid: "b1".to_owned()
            }
        ])
    );
    let worker = farm.registry.get("b1").expect("registered");
    assert_eq!(worker.state, State::Failed);
    assert_eq!(worker.holder, None);
    assert_eq!(worker.fail_reason.as_deref(), Some("no power"));
    // The killed holder's end later changes nothing.
    assert_eq!(farm.release(9, "error"), vec![]);
    assert_eq!(farm.state_of("b1"), State::Failed);
    assert_eq!(farm.fail("nobody", "x"), Err(WorkerError::NotFound));
}

#[test]
fn a_failed_worker_is_not_handed_on_before_its_killed_holder_released() {
    // The holder's programs may still drive the board while luxid kills
    // them: back in service at once, it waits in PREPARE for their end.
    for prepare_argv in [None, Some(&["/bin/reset"][..])] {
        let mut farm = Farm::new();
        farm.register("b1", prepare_argv);
        farm.state("b1", "IDLE", false).expect("to IDLE");
        if prepare_argv.is_some() {
            let now = farm.tick();
            farm.registry.prepared("b1", 1, Ok(()), now);
        }
        farm.assign(9, &["b1"]);
        farm.fail("b1", "no power").expect("failed");
        assert_eq!(farm.registry.draining_for("b1"), Some(9));
        farm.state("b1", "MAINTENANCE", false)
            .expect("to MAINTENANCE");
        assert_eq!(
            farm.state("b1", "IDLE", false),
            Ok(vec![]),
            "no prepare starts yet, nothing goes IDLE"
        );
        assert_eq!(farm.state_of("b1"), State::Prepare);
        // A waiting job does not get it, and an old prepare's end (the
        // seq the worker last ran) does not make it IDLE either.
        let now = farm.tick();
        let asked = farm.registry.request(10, 0, request(&[], &[], 1), now);
        assert_eq!(farm.checked(asked), Ok(vec![]));
        let now = farm.tick();
        let late = farm.registry.prepared("b1", 1, Ok(()), now);
        assert_eq!(farm.checked(late), vec![]);
        // Taking it out again cancels no prepare: none runs.
        if prepare_argv.is_some() {
            assert_eq!(farm.state("b1", "MAINTENANCE", false), Ok(vec![]));
            farm.state("b1", "IDLE", false).expect("to PREPARE");
        }
        let effects = farm.release(9, "error");
        assert_eq!(farm.registry.draining_for("b1"), None);
        match prepare_argv {
            None => assert_eq!(effects, vec![idle("b1"), assigned(10, &["b1"])]),
            Some(_) => assert_eq!(
                effects,
                vec![Effect::Prepare {
                    uuid: "b1".to_owned(),
                    seq: 2,
                    argv: vec!["/bin/reset".to_owned()],
                }]
            ),
        }
        // Saved and restored, the rule holds across a restart.
        let saved = farm.registry.saved();
        let restored = Registry::restore(saved.clone(), 0).expect("restores");
        assert_eq!(restored.saved(), saved);
    }
    // Deregistered and registered again, it still waits.
    let mut farm = Farm::new();
    farm.idle("b2");
    farm.assign(11, &["b2"]);
    farm.fail("b2", "smoke").expect("failed");
    let saved = farm.registry.saved();
    assert_eq!(saved.draining, vec![("b2".to_owned(), 11)]);
    let restored = Registry::restore(saved, 0).expect("restores");
    restored.check_invariants();
    farm.registry = restored;
    farm.registry.deregister("b2").expect("deregistered");
    farm.register("b2", None);
    farm.state("b2", "IDLE", false).expect("to PREPARE");
    assert_eq!(farm.state_of("b2"), State::Prepare);
    assert_eq!(farm.release(11, "error"), vec![idle("b2")]);
    assert_eq!(farm.state_of("b2"), State::Idle);
}

#[test]
fn a_newer_state_preempts_a_running_prepare() {
    let mut farm = Farm::new();
    farm.register("b1", Some(&["/bin/reset"]));
    farm.state("b1", "IDLE", false).expect("to PREPARE");
    assert_eq!(
        farm.fail("b1", "smoke"),
        Ok(vec![
            Effect::CancelPrepare {
                uuid: "b1".to_owned(),
                seq: 1
            },
            Effect::Failed {
                uuid: "b1".to_owned()
            }
        ])
    );
    assert_eq!(farm.state_of("b1"), State::Failed);
    // The canceled prepare's late end changes nothing.
    let now = farm.tick();
    assert_eq!(farm.registry.prepared("b1", 1, Ok(()), now), vec![]);
    assert_eq!(farm.state_of("b1"), State::Failed);

    // Prepare numbers are the registry's: b2's first is 2.
    farm.register("b2", Some(&["/bin/reset"]));
    farm.state("b2", "IDLE", false).expect("to PREPARE");
    assert_eq!(
        farm.state("b2", "MAINTENANCE", false),
        Ok(vec![Effect::CancelPrepare {
            uuid: "b2".to_owned(),
            seq: 2
        }])
    );
    // A registration that drops the argv does not forget the prepare
    // under way: it is still canceled.
    farm.state("b2", "IDLE", false).expect("to PREPARE");
    farm.register("b2", None);
    assert_eq!(
        farm.fail("b2", "smoke"),
        Ok(vec![
            Effect::CancelPrepare {
                uuid: "b2".to_owned(),
                seq: 3
            },
            Effect::Failed {
                uuid: "b2".to_owned()
            }
        ])
    );
    // Deregistered and registered anew, it never reuses a number.
    farm.registry.deregister("b2").expect("deregistered");
    farm.register("b2", Some(&["/bin/reset"]));
    let effects = farm.state("b2", "IDLE", false).expect("to PREPARE");
    assert!(
        matches!(effects.as_slice(), [Effect::Prepare { seq: 4, .. }]),
        "{effects:?}"
    );
    assert_eq!(farm.state_of("b2"), State::Prepare);
}

#[test]
fn registering_again() {
    let mut farm = Farm::new();
    // FAILED, same caps and address: prepared again.
    farm.idle("b1");
    farm.fail("b1", "smoke").expect("failed");
    assert_eq!(farm.register("b1", None), vec![idle("b1")]);
    assert_eq!(farm.state_of("b1"), State::Idle);
    // Nothing changed: unchanged, matched again (its groups may differ)
    // and told as `setWorkerGroups` tells it.
    assert_eq!(farm.register("b1", None), vec![idle("b1")]);
    assert_eq!(farm.state_of("b1"), State::Idle);
    // Other caps: MAINTENANCE, caps updated.
    let now = farm.tick();
    let effects = farm
        .registry
        .register(caps("b1", &[("arch", "arm64")]), None, None, None, now)
        .expect("registered");
    farm.registry.check_invariants();
    assert_eq!(effects, vec![]);
    let worker = farm.registry.get("b1").expect("registered");
    assert_eq!(worker.state, State::Maintenance);
    assert_eq!(worker.caps.get("arch").map(String::as_str), Some("arm64"));
    assert_eq!(worker.groups, groups(&["farm"]), "null groups keep them");
    // Held, then another address: BUSY first.
    farm.state("b1", "IDLE", false).expect("to IDLE");
    farm.assign(3, &["b1"]);
    let now = farm.tick();
    farm.registry
        .register(
            caps("b1", &[("arch", "arm64")]),
            None,
            Some("b1.lab:5555".to_owned()),
            None,
            now,
        )
        .expect("registered");
    farm.registry.check_invariants();
    assert_eq!(farm.state_of("b1"), State::Busy);
    assert_eq!(farm.release(3, "success"), vec![]);
    assert_eq!(farm.state_of("b1"), State::Maintenance);
}

#[test]
fn addresses_of_the_host_port_form_need_a_real_port() {
    let mut registry = Registry::new();
    for bad in ["host:0", "host:65536", "10.0.0.1:99999"] {
        assert_eq!(
            registry.register(caps("b1", &[]), None, Some(bad.to_owned()), None, 1.0),
            Err(WorkerError::BadAddress(bad.to_owned()))
        );
    }
    assert!(registry.is_empty(), "a refused registration adds nothing");
    for good in [
        "host:22",
        "/dev/ttyUSB0",
        "http://b1:8080/x",
        "b1",
        "[::1]:443",
    ] {
        registry
            .register(caps(good, &[]), None, Some(good.to_owned()), None, 1.0)
            .expect("a good address");
    }
}

#[test]
fn deregister_only_from_maintenance_or_failed() {
    let mut farm = Farm::new();
    farm.idle("b1");
    assert_eq!(
        farm.registry.deregister("b1"),
        Err(WorkerError::NotFailedOrMaintenance)
    );
    farm.fail("b1", "smoke").expect("failed");
    assert_eq!(farm.registry.deregister("b1"), Ok(vec![]));
    assert_eq!(farm.registry.deregister("b1"), Err(WorkerError::NotFound));
    farm.register("b2", None);
    assert_eq!(farm.registry.deregister("b2"), Ok(vec![]));
    assert!(farm.registry.is_empty());
}

#[test]
fn the_holder_s_end_prepares_its_workers() {
    let mut farm = Farm::new();
    farm.register("b1", Some(&["/bin/reset"]));
    farm.state("b1", "IDLE", false).expect("to PREPARE");
    let now = farm.tick();
    farm.registry.prepared("b1", 1, Ok(()), now);
    farm.idle("b2");
    farm.assign(4, &["b1", "b2"]);
    assert_eq!(farm.registry.held_by(4).count(), 2);
    let effects = farm.release(4, "canceled");
    let second_prepare = Effect::Prepare {
        uuid: "b1".to_owned(),
        seq: 2,
        argv: vec!["/bin/reset".to_owned()],
    };
    assert_eq!(effects, vec![second_prepare, idle("b2")]);
    assert_eq!(farm.state_of("b1"), State::Prepare);
    assert_eq!(farm.state_of("b2"), State::Idle);
    assert_eq!(farm.registry.held_by(4).count(), 0);
}

#[test]
fn the_history_keeps_the_last_twenty_holders() {
    let mut farm = Farm::new();
    farm.idle("b1");
    for job in 1..=25 {
        farm.assign(job, &["b1"]);
        farm.release(job, "success");
    }
    let history = &farm.registry.get("b1").expect("registered").history;
    assert_eq!(history.len(), HISTORY_MAX);
    assert_eq!(history.front().map(|holding| holding.job), Some(6));
    assert_eq!(history.back().map(|holding| holding.job), Some(25));
}

#[test]
fn assign_is_all_or_nothing() {
    let mut farm = Farm::new();
    farm.idle("b1");
    farm.register("b2", None);
    let now = farm.tick();
    assert_eq!(
        farm.registry
            .assign(1, &["b1".to_owned(), "b2".to_owned()], now),
        Err(WorkerError::InvalidTransition)
    );
    assert_eq!(farm.state_of("b1"), State::Idle, "nothing was assigned");
    farm.registry.check_invariants();
}

// ----- matching -----

fn matching_farm() -> Registry {
    let mut registry = Registry::new();
    type Spec<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [&'a str]);
    let workers: [Spec<'_>; 4] = [
        ("d", &[("arch", "arm64"), ("gpu", "yes")], &["lab"]),
        ("c", &[("arch", "arm64")], &["lab", "ci"]),
        ("b", &[("arch", "arm64")], &["lab"]),
        ("a", &[("arch", "x86")], &["lab"]),
    ];
    for (uuid, more, names) in workers {
        registry
            .register(caps(uuid, more), Some(groups(names)), None, None, 1.0)
            .expect("registered");
        registry.set_state(uuid, "IDLE", false, 2.0).expect("idle");
    }
    registry.check_invariants();
    registry
}

fn request(names: &[&str], more: &[(&str, &str)], count: u64) -> Request {
    let caps = more
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect();
    Request::new(groups(names), caps, Some(count)).expect("a good request")
}

#[test]
fn the_least_capable_fitting_worker_wins_ties_to_the_smallest_uuid() {
    let registry = matching_farm();
    // b and c both fit arm64; b has fewer groups.
    assert_eq!(
        registry.best_fit(&request(&[], &[("arch", "arm64")], 1)),
        Some(vec!["b".to_owned()])
    );
    // a and b score alike (2 caps, 1 group): the smaller uuid.
    assert_eq!(
        registry.best_fit(&request(&["lab"], &[], 1)),
        Some(vec!["a".to_owned()])
    );
    assert_eq!(
        registry.best_fit(&request(&["ci"], &[], 1)),
        Some(vec!["c".to_owned()])
    );
    assert_eq!(
        registry.best_fit(&request(&[], &[("arch", "arm64")], 3)),
        Some(vec!["b".to_owned(), "c".to_owned(), "d".to_owned()])
    );
    assert_eq!(
        registry.best_fit(&request(&[], &[("arch", "arm64")], 4)),
        None,
        "all or nothing"
    );
    assert_eq!(registry.best_fit(&request(&["other"], &[], 1)), None);
}

#[test]
fn only_idle_workers_are_handed_out_but_any_counts_as_possible() {
    let mut registry = matching_farm();
    registry
        .assign(1, &["d".to_owned()], 3.0)
        .expect("assigned");
    let gpu = request(&[], &[("gpu", "yes")], 1);
    assert_eq!(registry.best_fit(&gpu), None);
    assert!(registry.could_ever_fit(&gpu));
    assert!(!registry.could_ever_fit(&request(&[], &[("gpu", "no")], 1)));
    assert!(!registry.could_ever_fit(&request(&[], &[("arch", "arm64")], 4)));
}

#[test]
fn requests_are_checked() {
    assert_eq!(
        Request::new(BTreeSet::new(), BTreeMap::new(), None).map(|request| request.count),
        Ok(1)
    );
    assert!(Request::new(BTreeSet::new(), BTreeMap::new(), Some(0)).is_err());
    assert!(Request::new(BTreeSet::new(), BTreeMap::new(), Some(64)).is_ok());
    let over = Request::new(BTreeSet::new(), BTreeMap::new(), Some(65));
    assert_eq!(
        over,
        Err("workers: count 65 is over the limit of 64".to_owned())
    );
}

#[test]
fn set_groups_of_an_idle_worker_asks_for_a_new_match() {
    let mut registry = matching_farm();
    assert_eq!(
        registry.set_groups("a", groups(&["ci"]), 5.0),
        Ok(vec![idle("a")])
    );
    assert_eq!(
        registry.best_fit(&request(&["ci"], &[], 1)),
        Some(vec!["a".to_owned()])
    );
    assert_eq!(
        registry.set_groups("nobody", groups(&[]), 5.0),
        Err(WorkerError::NotFound)
    );
}

// ----- listing -----

fn uuids(listing: &list::Listing<'_>) -> Vec<String> {
    listing
        .workers
        .iter()
        .map(|worker| worker.uuid.clone())
        .collect()
}

#[test]
fn listing_filters_sorts_and_pages() {
    let mut registry = matching_farm();
    registry.assign(1, &["c".to_owned()], 3.0).expect("held");
    let all = registry.list(&Filter::default(), Sort::default(), &Page::default());
    assert_eq!(uuids(&all), ["a", "b", "c", "d"]);
    assert_eq!((all.total, all.remaining), (4, 0));

    let arm = Filter {
        caps: caps("", &[("arch", "arm64")])
            .into_iter()
            .filter(|(key, _)| key != UUID_CAP)
            .collect(),
        ..Filter::default()
    };
    let listing = registry.list(&arm, Sort::default(), &Page::default());
    assert_eq!(uuids(&listing), ["b", "c", "d"]);
    let running = Filter {
        states: [State::Running].into_iter().collect(),
        ..Filter::default()
    };
    assert_eq!(
        uuids(&registry.list(&running, Sort::default(), &Page::default())),
        ["c"]
    );

    // By state, descending: RUNNING > IDLE; uuid breaks ties (reversed too).
    let by_state = Sort {
        item: SortItem::State,
        order: Order::Descending,
    };
    assert_eq!(
        uuids(&registry.list(&Filter::default(), by_state, &Page::default())),
        ["c", "d", "b", "a"]
    );
    let by_groups = Sort {
        item: SortItem::Groups,
        order: Order::Ascending,
    };
    // ["ci", "lab"] sorts before ["lab"].
    assert_eq!(
        uuids(&registry.list(&Filter::default(), by_groups, &Page::default())),
        ["c", "a", "b", "d"]
    );
    assert_eq!(SortItem::parse("GrOuPs"), Ok(SortItem::Groups));
    assert_eq!(SortItem::parse("caps"), Err(WorkerError::UnknownSortItem));

    // Pages of two, forward then backward, the anchor never in the page.
    let page = |after: Option<&str>, direction| Page {
        after: after.map(str::to_owned),
        direction,
        limit: 2,
    };
    let first = registry.list(
        &Filter::default(),
        Sort::default(),
        &page(None, Direction::Forward),
    );
    assert_eq!(
        (uuids(&first), first.remaining),
        (vec!["a".into(), "b".into()], 2)
    );
    let second = registry.list(
        &Filter::default(),
        Sort::default(),
        &page(Some("b"), Direction::Forward),
    );
    assert_eq!(
        (uuids(&second), second.remaining),
        (vec!["c".into(), "d".into()], 0)
    );
    let back = registry.list(
        &Filter::default(),
        Sort::default(),
        &page(Some("d"), Direction::Backward),
    );
    assert_eq!(
        (uuids(&back), back.remaining),
        (vec!["b".into(), "c".into()], 1)
    );
    // An anchor that is gone still places the page.
    let gone = registry.list(
        &Filter::default(),
        Sort::default(),
        &page(Some("bb"), Direction::Forward),
    );
    assert_eq!(uuids(&gone), ["c", "d"]);
    assert_eq!(gone.total, 4);
}

// ----- waiting jobs -----

fn assigned(job: JobId, uuids: &[&str]) -> Effect {
    Effect::Assigned {
        job,
        uuids: uuids.iter().map(|uuid| uuid.to_string()).collect(),
    }
}

fn assignments(effects: &[Effect]) -> Vec<Effect> {
    effects
        .iter()
        .filter(|effect| matches!(effect, Effect::Assigned { .. }))
        .cloned()
        .collect()
}

/// Registers `uuid` with `names` groups and caps `arch=arm` plus `extra`
/// more, and lets it in.
fn let_in(registry: &mut Registry, uuid: &str, names: &[&str], arch: bool, extra: usize) {
    let mut more: Vec<(String, String)> = (0..extra)
        .map(|index| (format!("cap{index}"), "x".to_owned()))
        .collect();
    if arch {
        more.push(("arch".to_owned(), "arm".to_owned()));
    }
    let more: Vec<(&str, &str)> = more.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    registry
        .register(caps(uuid, &more), Some(groups(names)), None, None, 1.0)
        .expect("registered");
    registry.set_state(uuid, "IDLE", false, 2.0).expect("idle");
    registry.check_invariants();
}

/// Boruta's best-match table: of the fitting workers, the least capable
/// goes first; two that do not fit are never handed out.
#[test]
fn three_identical_requests_get_the_fitting_workers_least_capable_first() {
    let mut registry = Registry::new();
    let five = ["g1", "g2", "g3", "g4", "g5"];
    let_in(&mut registry, "c-5g5c", &five, true, 4);
    let_in(&mut registry, "a-5g1c", &five, true, 0);
    let_in(&mut registry, "b-1g7c", &["g1"], true, 6);
    let_in(&mut registry, "d-2g0c", &["g1", "g2"], false, 0);
    let_in(&mut registry, "e-0g2c", &[], true, 1);
    let wanted = request(&["g1"], &[("arch", "arm")], 1);
    let mut got = Vec::new();
    for job in 1..=4 {
        let effects = registry
            .request(job, 0, wanted.clone(), 3.0)
            .expect("some worker fits");
        registry.check_invariants();
        got.push(assignments(&effects));
    }
    assert_eq!(
        got,
        [
            vec![assigned(1, &["a-5g1c"])],
            vec![assigned(2, &["b-1g7c"])],
            vec![assigned(3, &["c-5g5c"])],
            vec![],
        ]
    );
    assert!(registry.waiter(4).is_some(), "the fourth waits");
}

#[test]
fn an_idle_worker_goes_to_the_first_waiting_job_it_fits_by_priority_then_id() {
    let mut registry = matching_farm();
    let arm = request(&[], &[("arch", "arm64")], 3);
    registry.request(1, 0, arm, 3.0).expect("fits");
    // Every arm64 worker is held; three more jobs wait for one.
    let one = request(&[], &[("arch", "arm64")], 1);
    for (job, priority) in [(2, 0), (3, -5), (4, -5)] {
        let effects = registry
            .request(job, priority, one.clone(), 4.0)
            .expect("fits");
        assert_eq!(effects, vec![]);
    }
    registry.check_invariants();
    let effects = registry.release(1, "success", 5.0);
    registry.check_invariants();
    // Released as b, c, d: the best go to the first waiters.
    assert_eq!(
        assignments(&effects),
        [
            assigned(3, &["b"]),
            assigned(4, &["c"]),
            assigned(2, &["d"]),
        ]
    );
}

#[test]
fn a_job_that_cannot_be_served_does_not_block_a_later_one() {
    let mut registry = matching_farm();
    // Job 1 wants two GPUs (there is one); job 2 wants any arm64 board.
    let gpus = request(&[], &[("gpu", "yes")], 1);
    registry.request(9, 0, gpus.clone(), 3.0).expect("fits");
    let two = request(&["lab"], &[], 4);
    let one = request(&["lab"], &[], 1);
    // Four lab workers exist, three are IDLE: job 1 waits, job 2 runs.
    assert_eq!(registry.request(1, -10, two, 4.0).expect("fits"), vec![]);
    assert_eq!(
        assignments(&registry.request(2, 0, one, 4.0).expect("fits")),
        [assigned(2, &["a"])]
    );
    registry.check_invariants();
    // Back come d and a: job 1 gets all four at once.
    registry.release(9, "success", 5.0);
    let effects = registry.release(2, "success", 6.0);
    registry.check_invariants();
    assert_eq!(assignments(&effects), [assigned(1, &["a", "b", "c", "d"])]);
    // Asking again while holding changes nothing.
    assert_eq!(registry.request(1, 0, gpus, 7.0), Ok(vec![]));
}

#[test]
fn a_request_no_worker_could_ever_fit_is_refused_and_waiters_end_when_the_last_fit_goes() {
    let mut registry = matching_farm();
    let never = request(&[], &[("arch", "sparc")], 1);
    assert_eq!(
        registry.request(1, 0, never, 3.0),
        Err(WorkerError::NeverFits)
    );
    assert!(registry.waiter(1).is_none());
    let gpu = request(&[], &[("gpu", "yes")], 1);
    registry.request(2, 0, gpu.clone(), 3.0).expect("fits");
    registry.request(3, 0, gpu, 3.0).expect("fits");
    registry
        .set_state("d", "MAINTENANCE", false, 4.0)
        .expect("busy");
    registry.release(2, "success", 5.0);
    assert_eq!(
        registry.get("d").map(|worker| worker.state),
        Some(State::Maintenance)
    );
    let effects = registry.deregister("d").expect("in maintenance");
    registry.check_invariants();
    assert_eq!(
        effects,
        [Effect::EndJob {
            job: 3,
            reason: NO_WORKER_MATCHES.to_owned()
        }]
    );
    assert_eq!(
        registry.condemned().collect::<Vec<_>>(),
        [(3, NO_WORKER_MATCHES)]
    );
    registry.release(3, "error", 6.0);
    assert_eq!(registry.condemned().count(), 0);
}

#[test]
fn holders_in_a_row_ending_in_error_quarantine_a_worker() {
    let mut registry = Registry::with_quarantine_after(3);
    let_in(&mut registry, "b1", &["farm"], false, 0);
    let any = request(&[], &[], 1);
    let mut now = 3.0;
    for (job, status) in [
        (1, "error"),
        (2, "error"),
        (3, "success"),
        (4, "error"),
        (5, "error"),
    ] {
        registry.request(job, 0, any.clone(), now).expect("fits");
        registry.release(job, status, now + 1.0);
        now += 2.0;
        assert_eq!(
            registry.get("b1").map(|worker| worker.state),
            Some(State::Idle)
        );
    }
    registry.request(6, 0, any, now).expect("fits");
    let effects = registry.release(6, "error", now + 1.0);
    registry.check_invariants();
    assert_eq!(
        effects,
        [Effect::Failed {
            uuid: "b1".to_owned()
        }]
    );
    let worker = registry.get("b1").expect("registered");
    assert_eq!(worker.state, State::Failed);
    assert_eq!(
        worker.fail_reason.as_deref(),
        Some("quarantined: 3 holders in a row ended in error (jobs 4, 5, 6)")
    );
}

// ----- every sequence keeps the invariants -----

mod properties {
    use proptest::prelude::*;

    use super::*;

    const UUIDS: [&str; 4] = ["w0", "w1", "w2", "w3"];

    #[derive(Clone, Debug)]
    enum Step {
        Register {
            uuid: usize,
            arm: bool,
            prepare: bool,
        },
        Deregister(usize),
        SetState {
            uuid: usize,
            idle: bool,
            kill: bool,
        },
        Fail(usize),
        Prepared {
            uuid: usize,
            ok: bool,
        },
        Match {
            job: JobId,
            count: usize,
            arm: bool,
        },
        Release(JobId),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..4usize, any::<bool>(), any::<bool>())
                .prop_map(|(uuid, arm, prepare)| Step::Register { uuid, arm, prepare }),
            (0..4usize).prop_map(Step::Deregister),
            (0..4usize, any::<bool>(), any::<bool>())
                .prop_map(|(uuid, idle, kill)| Step::SetState { uuid, idle, kill }),
            (0..4usize).prop_map(Step::Fail),
            (0..4usize, any::<bool>()).prop_map(|(uuid, ok)| Step::Prepared { uuid, ok }),
            (1..4u64, 1..3usize, any::<bool>()).prop_map(|(job, count, arm)| Step::Match {
                job,
                count,
                arm
            }),
            (1..4u64).prop_map(Step::Release),
        ]
    }

    proptest! {
        #[test]
        fn the_invariants_hold_after_every_step(steps in prop::collection::vec(step(), 1..60)) {
            let mut registry = Registry::new();
            let mut now = 0.0;
            for step in steps {
                now += 1.0;
                match step {
                    Step::Register { uuid, arm, prepare } => {
                        let more: &[(&str, &str)] = if arm { &[("arch", "arm64")] } else { &[] };
                        let argv = prepare.then(|| vec!["/bin/reset".to_owned()]);
                        registry
                            .register(caps(UUIDS[uuid], more), None, None, argv, now)
                            .expect("a good registration");
                    }
                    Step::Deregister(uuid) => {
                        let before = registry.get(UUIDS[uuid]).map(|worker| worker.state);
                        let result = registry.deregister(UUIDS[uuid]);
                        prop_assert_eq!(
                            result.is_ok(),
                            matches!(before, Some(State::Maintenance | State::Failed))
                        );
                    }
                    Step::SetState { uuid, idle, kill } => {
                        let state = if idle { "IDLE" } else { "MAINTENANCE" };
                        let _ = registry.set_state(UUIDS[uuid], state, kill, now);
                    }
                    Step::Fail(uuid) => {
                        let _ = registry.set_fail(UUIDS[uuid], "smoke", now);
                    }
                    Step::Prepared { uuid, ok } => {
                        let outcome = if ok { Ok(()) } else { Err("exit 1".to_owned()) };
                        let seq = registry.get(UUIDS[uuid]).map_or(0, |worker| worker.prepare_seq);
                        registry.prepared(UUIDS[uuid], seq, outcome, now);
                    }
                    Step::Match { job, count, arm } => {
                        let more: &[(&str, &str)] = if arm { &[("arch", "arm64")] } else { &[] };
                        let wanted = request(&[], more, count as u64);
                        let possible = registry.could_ever_fit(&wanted);
                        let result = registry.request(job, 0, wanted.clone(), now);
                        if registry.held_by(job).count() == 0 && registry.waiter(job).is_none() {
                            prop_assert!(result.is_err() || registry.condemned().any(|(j, _)| j == job));
                        }
                        for effect in result.unwrap_or_default() {
                            if let Effect::Assigned { uuids, .. } = effect {
                                prop_assert!(possible);
                                prop_assert_eq!(uuids.len(), count);
                                for uuid in &uuids {
                                    let worker = registry.get(uuid).expect("listed");
                                    prop_assert!(worker.could_fit(&wanted));
                                }
                            }
                        }
                    }
                    Step::Release(job) => {
                        registry.release(job, "success", now);
                        prop_assert_eq!(registry.held_by(job).count(), 0);
                    }
                }
                registry.check_invariants();
            }
        }
    }
}

// ----- Boruta's listener table -----

/// What a `WorkerChange` listener heard.
#[derive(Debug, Default, PartialEq)]
struct Heard {
    idle: Vec<String>,
    failed: Vec<String>,
    ended: Vec<JobId>,
}

impl WorkerChange for Heard {
    fn worker_idle_notification(&mut self, uuid: &str) {
        self.idle.push(uuid.to_owned());
    }
    fn worker_fail_notification(&mut self, uuid: &str) {
        self.failed.push(uuid.to_owned());
    }
    fn job_end_notification(&mut self, job: JobId, _reason: &str) {
        self.ended.push(job);
    }
}

/// `b1` (with a prepare or not) brought into `state`; job 7 holds it when
/// RUNNING or BUSY.
fn worker_in(state: State, prepare: bool) -> Farm {
    let mut farm = Farm::new();
    let argv: Option<&[&str]> = prepare.then_some(&["/bin/reset"][..]);
    farm.register("b1", argv);
    let to_idle = |farm: &mut Farm| {
        farm.state("b1", "IDLE", false).expect("to IDLE");
        if prepare {
            let now = farm.tick();
            let seq = farm.registry.get("b1").expect("registered").prepare_seq;
            farm.registry.prepared("b1", seq, Ok(()), now);
        }
    };
    match state {
        State::Maintenance => {}
        State::Prepare => farm
            .state("b1", "IDLE", false)
            .map(drop)
            .expect("to PREPARE"),
        State::Idle => to_idle(&mut farm),
        State::Running | State::Busy => {
            to_idle(&mut farm);
            farm.assign(7, &["b1"]);
            if state == State::Busy {
                farm.state("b1", "MAINTENANCE", false).expect("to BUSY");
            }
        }
        State::Failed => {
            to_idle(&mut farm);
            farm.fail("b1", "smoke").expect("to FAILED");
        }
    }
    assert_eq!(farm.state_of("b1"), state);
    farm
}

/// Which changes tell the scheduler of an IDLE worker (Boruta's
/// `OnWorkerIdle`) and of a failing one, and which end its holder.
#[test]
fn the_listener_table() {
    type Call = fn(&mut Farm) -> Vec<Effect>;
    let cases: [(&str, State, bool, Call, Heard); 12] = [
        (
            "let in, no prepare",
            State::Maintenance,
            false,
            |f| f.state("b1", "IDLE", false).unwrap(),
            Heard {
                idle: vec!["b1".into()],
                ..Heard::default()
            },
        ),
        (
            "let in, prepare runs",
            State::Maintenance,
            true,
            |f| f.state("b1", "IDLE", false).unwrap(),
            Heard::default(),
        ),
        (
            "prepare succeeds",
            State::Prepare,
            true,
            |f| {
                let now = f.tick();
                f.registry.prepared("b1", 1, Ok(()), now)
            },
            Heard {
                idle: vec!["b1".into()],
                ..Heard::default()
            },
        ),
        (
            "prepare fails",
            State::Prepare,
            true,
            |f| {
                let now = f.tick();
                f.registry.prepared("b1", 1, Err("x".into()), now)
            },
            Heard {
                failed: vec!["b1".into()],
                ..Heard::default()
            },
        ),
        (
            "new groups of an IDLE worker",
            State::Idle,
            false,
            |f| {
                let now = f.tick();
                f.registry.set_groups("b1", groups(&["ci"]), now).unwrap()
            },
            Heard {
                idle: vec!["b1".into()],
                ..Heard::default()
            },
        ),
        (
            "fail while IDLE",
            State::Idle,
            false,
            |f| f.fail("b1", "smoke").unwrap(),
            Heard {
                failed: vec!["b1".into()],
                ..Heard::default()
            },
        ),
        (
            "fail while held",
            State::Running,
            false,
            |f| f.fail("b1", "smoke").unwrap(),
            Heard {
                failed: vec!["b1".into()],
                ended: vec![7],
                ..Heard::default()
            },
        ),
        (
            "maintenance while held",
            State::Running,
            false,
            |f| f.state("b1", "MAINTENANCE", false).unwrap(),
            Heard::default(),
        ),
        (
            "maintenance with kill while held",
            State::Running,
            false,
            |f| f.state("b1", "MAINTENANCE", true).unwrap(),
            Heard {
                ended: vec![7],
                ..Heard::default()
            },
        ),
        (
            "holder ends, no prepare",
            State::Running,
            false,
            |f| f.release(7, "success"),
            Heard {
                idle: vec!["b1".into()],
                ..Heard::default()
            },
        ),
        (
            "holder of a BUSY worker ends",
            State::Busy,
            false,
            |f| f.release(7, "success"),
            Heard::default(),
        ),
        (
            "FAILED registered again unchanged",
            State::Failed,
            false,
            |f| f.register("b1", None),
            Heard {
                idle: vec!["b1".into()],
                ..Heard::default()
            },
        ),
    ];
    for (what, state, prepare, call, expected) in cases {
        let mut farm = worker_in(state, prepare);
        let mut heard = Heard::default();
        for effect in call(&mut farm) {
            effect.notify(&mut heard);
        }
        farm.registry.check_invariants();
        assert_eq!(heard, expected, "{what}");
    }
}
