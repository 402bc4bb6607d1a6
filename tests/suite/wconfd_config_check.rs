//! `[wconfd] config_lock_check` over the wire (D70): a configuration write
//! that changes an instance, node or node group whose lock the writer does
//! not hold exclusively is let through unchecked ("off", the default),
//! logged, told as `config.lock_violation` and written ("log"), or refused
//! with nothing changed ("refuse"). Writers are real processes holding
//! their livelocks.

use serde_json::{Value, json};

use crate::daemon::{Client, DEADLINE, OwnerProcess, Wconfd, list_locks, try_update, wait_until};

/// Takes `entries` for `owner`, which must be granted at once.
fn take(client: &mut Client, owner: &OwnerProcess, entries: &[(&str, &str)]) {
    assert_eq!(try_update(client, owner, entries), json!([]), "{entries:?}");
}

const WARNING: &str = "config write changes what the writer does not hold exclusively";

/// The entities every test starts from: two instances, two nodes, a group.
fn entities(config: &mut Value) {
    config["instances"] = json!({
        "i-uuid-1": {"name": "web1", "primary_node": "n-uuid-1", "admin_state": "up"},
        "i-uuid-2": {"name": "db1", "primary_node": "n-uuid-2", "admin_state": "up"},
    });
    config["nodes"] = json!({
        "n-uuid-1": {"name": "node1", "group": "g-uuid-1", "offline": false},
        "n-uuid-2": {"name": "node2", "group": "g-uuid-1", "offline": false},
    });
    config["nodegroups"] = json!({"g-uuid-1": {"name": "default"}});
}

/// wconfd with `toml` as its settings, its config holding [`entities`]
/// (written by an owner holding the BGL exclusively, which any setting
/// lets through), and a client.
fn start(toml: &str) -> (Wconfd, Client) {
    let wconfd = Wconfd::start_with_settings(toml);
    let mut client = wconfd.client();
    let seeder = OwnerProcess::spawn(&wconfd.livelock_dir(), 99);
    take(
        &mut client,
        &seeder,
        &[
            ("cluster/BGL", "exclusive"),
            ("cluster/config", "exclusive"),
        ],
    );
    let mut config = client.ok("readConfig", json!([]));
    entities(&mut config);
    assert_eq!(
        client.ok("writeConfigAndUnlock", json!([seeder.owner(), config])),
        json!(true)
    );
    client.ok("freeLocks", json!([seeder.owner()]));
    assert_eq!(client.ok("readConfig", json!([]))["serial_no"], json!(2));
    (wconfd, client)
}

/// The `config.*` events so far.
fn config_events(client: &mut Client) -> Vec<Value> {
    let answer = client.ok("watchEvents", json!([0, ["config."], 0]));
    answer["events"].as_array().expect("events").clone()
}

fn violations(client: &mut Client) -> Vec<Value> {
    config_events(client)
        .into_iter()
        .filter(|event| event["type"] == "config.lock_violation")
        .collect()
}

/// A write of node1 taken offline and a new node group, by `writer`.
fn offline_node_and_new_group(client: &mut Client) -> Value {
    let mut config = client.ok("readConfig", json!([]));
    config["nodes"]["n-uuid-1"]["offline"] = json!(true);
    config["nodegroups"]["g-uuid-2"] = json!({"name": "spare"});
    config
}

fn config_file(wconfd: &Wconfd) -> Vec<u8> {
    std::fs::read(wconfd.root().path().join("config.data")).expect("config.data")
}

#[test]
fn off_lets_every_write_through_and_says_nothing() {
    for toml in ["", "[wconfd]\nconfig_lock_check = \"off\"\n"] {
        let (wconfd, mut client) = start(toml);
        let writer = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
        take(&mut client, &writer, &[("cluster/config", "exclusive")]);
        let mut config = offline_node_and_new_group(&mut client);
        config["instances"]["i-uuid-1"]["name"] = json!("web9");
        assert_eq!(
            client.ok("writeConfig", json!([writer.owner(), config])),
            json!([]),
            "{toml:?}"
        );
        let written = client.ok("readConfig", json!([]));
        assert_eq!(written["serial_no"], json!(3), "{toml:?}");
        assert_eq!(written["instances"]["i-uuid-1"]["name"], json!("web9"));
        assert_eq!(violations(&mut client), Vec::<Value>::new(), "{toml:?}");
        assert!(
            !wconfd.log().contains(WARNING),
            "{toml:?}:\n{}",
            wconfd.log()
        );
    }
}

#[test]
fn log_writes_and_tells_the_entities_and_their_locks() {
    let (wconfd, mut client) = start("[wconfd]\nconfig_lock_check = \"log\"\n");
    let writer = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    // node/n-uuid-1 shared is not enough; instance/web1 is held as needed.
    take(
        &mut client,
        &writer,
        &[
            ("cluster/BGL", "shared"),
            ("instance/web1", "exclusive"),
            ("node/n-uuid-1", "shared"),
            ("cluster/config", "exclusive"),
        ],
    );
    let mut config = offline_node_and_new_group(&mut client);
    config["instances"]["i-uuid-1"]["admin_state"] = json!("down");
    assert_eq!(
        client.ok("writeConfig", json!([writer.owner(), config])),
        json!([])
    );
    let written = client.ok("readConfig", json!([]));
    assert_eq!(written["serial_no"], json!(3));
    assert_eq!(written["nodes"]["n-uuid-1"]["offline"], json!(true));
    let told = violations(&mut client);
    assert_eq!(told.len(), 1, "{told:#?}");
    let event = &told[0];
    assert_eq!(event["owner"], json!("1"));
    assert_eq!(event["refused"], json!(false));
    assert_eq!(event["count"], json!(2));
    assert_eq!(
        event["kinds"],
        json!({"instance": 0, "nodegroup": 1, "node": 1})
    );
    // In lock order: node groups before nodes.
    assert_eq!(
        event["violations"],
        json!([
            {"kind": "nodegroup", "uuid": "g-uuid-2", "name": "spare", "change": "added",
             "locks": ["nodegroup/g-uuid-2"]},
            {"kind": "node", "uuid": "n-uuid-1", "name": "node1", "change": "changed",
             "locks": ["node/n-uuid-1"]},
        ])
    );
    // The violation comes before the write it let through.
    let kinds: Vec<Value> = config_events(&mut client)
        .iter()
        .map(|event| event["type"].clone())
        .collect();
    assert_eq!(
        kinds,
        ["config.written", "config.lock_violation", "config.written"]
    );
    wait_until("the warning is logged", DEADLINE, || {
        let log = wconfd.log();
        log.contains(WARNING)
            && log.contains("node node1 (uuid n-uuid-1, changed) needs node/n-uuid-1")
            && log.contains("nodegroup spare (uuid g-uuid-2, added) needs nodegroup/g-uuid-2")
    });
    // With the locks held exclusively the next write is clean.
    client.ok("freeLocks", json!([writer.owner()]));
    take(
        &mut client,
        &writer,
        &[
            ("cluster/BGL", "shared"),
            ("nodegroup/g-uuid-2", "exclusive"),
            ("node/n-uuid-1", "exclusive"),
            ("cluster/config", "exclusive"),
        ],
    );
    let mut config = client.ok("readConfig", json!([]));
    config["nodes"]["n-uuid-1"]["offline"] = json!(false);
    config["nodegroups"]["g-uuid-2"]["name"] = json!("spare2");
    assert_eq!(
        client.ok("writeConfigAndUnlock", json!([writer.owner(), config])),
        json!(true)
    );
    assert_eq!(client.ok("readConfig", json!([]))["serial_no"], json!(4));
    assert_eq!(violations(&mut client).len(), 1);
}

#[test]
fn refuse_names_the_entities_and_locks_and_changes_nothing() {
    let (wconfd, mut client) = start("[wconfd]\nconfig_lock_check = \"refuse\"\n");
    let writer = OwnerProcess::spawn(&wconfd.livelock_dir(), 1);
    take(
        &mut client,
        &writer,
        &[
            ("cluster/BGL", "shared"),
            ("instance/web1", "exclusive"),
            ("cluster/config", "exclusive"),
        ],
    );
    let before = client.ok("readConfig", json!([]));
    let file_before = config_file(&wconfd);
    // A rename needs the new name's lock too.
    let mut config = before.clone();
    config["instances"]["i-uuid-1"]["name"] = json!("web9");
    for method in ["writeConfig", "writeConfigAndUnlock"] {
        let answer = client.call(method, json!([writer.owner(), config]));
        let Err((class, args)) = answer else {
            panic!("{method} answered {answer:?}");
        };
        assert_eq!(class, "GenericError", "{method}");
        let text = crate::daemon::message(&args);
        assert!(text.contains("config write refused"), "{text}");
        assert!(
            text.contains("instance web9 (uuid i-uuid-1, changed) needs instance/web9"),
            "{text}"
        );
        assert!(!text.contains("instance/web1"), "{text}");
        assert_eq!(
            args[1],
            json!({"count": 1, "violations": [
                {"kind": "instance", "uuid": "i-uuid-1", "name": "web9", "change": "changed",
                 "locks": ["instance/web9"]},
            ]}),
            "{method}"
        );
        // Nothing changed: the file, the serial, and the writer's locks.
        assert_eq!(client.ok("readConfig", json!([])), before, "{method}");
        assert_eq!(config_file(&wconfd), file_before, "{method}");
        assert_eq!(
            list_locks(&mut client, &writer),
            json!([
                ["cluster/BGL", "shared"],
                ["instance/web1", "exclusive"],
                ["cluster/config", "exclusive"]
            ]),
            "{method}"
        );
    }
    let told = violations(&mut client);
    assert_eq!(told.len(), 2, "{told:#?}");
    assert!(told.iter().all(|event| event["refused"] == json!(true)));
    assert_eq!(told[0]["kinds"]["instance"], json!(1));
    wait_until("the refusal is logged", DEADLINE, || {
        wconfd.log().contains("needs instance/web9")
    });

    // Many at once: ten named, the rest counted.
    let mut many = before.clone();
    for index in 0..12 {
        many["nodes"][format!("n-new-{index:02}")] = json!({"name": format!("new{index}")});
    }
    let (class, text) = client.fails("writeConfig", json!([writer.owner(), many]));
    assert_eq!(class, "GenericError");
    assert_eq!(text.matches(" needs ").count(), 10, "{text}");
    assert!(text.ends_with("; and 2 more"), "{text}");
    let told = violations(&mut client);
    let last = told.last().expect("told");
    assert_eq!(last["count"], json!(12));
    assert_eq!(last["kinds"]["node"], json!(12));
    assert_eq!(last["violations"].as_array().expect("a list").len(), 10);
    assert_eq!(config_file(&wconfd), file_before);

    // With the new name's lock the rename goes through.
    client.ok("freeLocks", json!([writer.owner()]));
    take(
        &mut client,
        &writer,
        &[
            ("cluster/BGL", "shared"),
            ("instance/web1", "exclusive"),
            ("instance/web9", "exclusive"),
            ("cluster/config", "exclusive"),
        ],
    );
    assert_eq!(
        client.ok("writeConfigAndUnlock", json!([writer.owner(), config])),
        json!(true)
    );
    let written = client.ok("readConfig", json!([]));
    assert_eq!(written["serial_no"], json!(3));
    assert_eq!(written["instances"]["i-uuid-1"]["name"], json!("web9"));

    // A group lock held exclusively covers its members, whether added,
    // removed or changed.
    client.ok("freeLocks", json!([writer.owner()]));
    let group = OwnerProcess::spawn(&wconfd.livelock_dir(), 2);
    take(
        &mut client,
        &group,
        &[
            ("instance/[lockset]", "exclusive"),
            ("cluster/config", "exclusive"),
        ],
    );
    let mut config = written.clone();
    config["instances"]
        .as_object_mut()
        .expect("instances")
        .remove("i-uuid-2");
    config["instances"]["i-uuid-3"] = json!({"name": "web3"});
    assert_eq!(
        client.ok("writeConfig", json!([group.owner(), config])),
        json!([])
    );
    config["nodes"]["n-uuid-2"]["offline"] = json!(true);
    let (_, text) = client.fails("writeConfig", json!([group.owner(), config]));
    assert!(text.contains("needs node/n-uuid-2"), "{text}");
    assert_eq!(client.ok("readConfig", json!([]))["serial_no"], json!(4));
}
