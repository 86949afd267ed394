//! What the real binary makes of the settings a new user gets wrong after
//! the quick start: a misspelled storage setting (which would keep
//! nothing across restarts) stops it, the start log says where sessions
//! live, the command line tools' own variables are not taken for typos, and
//! a data directory it cannot use is refused with the problem named.

use crate::common::{Dir, Server, free_port};
use crate::startup::run_to_exit;
use std::process::Command;

#[test]
fn a_misspelled_storage_setting_stops_the_server_naming_the_setting_meant() {
    for (typo, meant) in [
        ("RELAY_DATADIR", "RELAY_DATA_DIR"),
        ("RELAY_REDIS_ULR", "RELAY_REDIS_URL"),
    ] {
        let (status, stderr) = run_to_exit(&[], &[(typo, "/var/lib/relay")]);
        assert_eq!(status.code(), Some(2), "{typo}: {stderr}");
        assert!(
            stderr.contains(&format!("{typo} is not a setting; did you mean {meant}?")),
            "{stderr}"
        );
        assert!(stderr.contains("lost at the next restart"), "{stderr}");
    }
}

#[test]
fn the_start_log_says_where_sessions_live() {
    // In memory (unless the whole suite runs with a storage of its own).
    if std::env::var_os("TEST_WITH_DATA_DIR").is_none()
        && std::env::var_os("TEST_WITH_REDIS").is_none()
    {
        let srv = Server::start_single();
        srv.wait_for_log("storage: memory, nothing kept across restarts");
    }
    // A data directory: the database's path.
    let dir = Dir::new("storage-log");
    let srv = Server::start_single_with(&[("RELAY_DATA_DIR", dir.path())]);
    let line = srv.wait_for_log("storage: SQLite database");
    assert!(line.contains(&format!("{}/relay.db", dir.path())), "{line}");
    drop(srv);
    // Redis: the URL without its password (no Redis need answer: the
    // server listens and keeps trying).
    let url = format!("redis://:hunter2@127.0.0.1:{}/3", free_port());
    let srv = Server::start_single_with(&[("RELAY_REDIS_URL", &url)]);
    let line = srv.wait_for_log("storage: Redis at");
    assert!(line.contains("redis://127.0.0.1:"), "{line}");
    assert!(line.contains("/3 (keys start with relay:)"), "{line}");
    let logs = srv.logs();
    assert!(!logs.iter().any(|l| l.contains("hunter2")), "{logs:?}");
}

#[test]
fn the_tools_variables_are_not_taken_for_misspelled_settings() {
    // Exported for `relay agent` and `relay send`, as the docs suggest, in
    // the shell that starts the server too.
    let tools = [
        ("RELAY_URL", "http://127.0.0.1:8000"),
        ("RELAY_CA", "/etc/relay/ca.pem"),
        ("RELAY_E2E_KEY", "k"),
        ("RELAY_SESSION_ID", "demo"),
    ];
    let srv = Server::start_single_with(&tools);
    srv.wait_for_log("RELAY_URL is read by the command line tools");
    let logs = srv.logs();
    let warned: Vec<&String> = logs
        .iter()
        .filter(|l| l.contains("is not a setting") || l.contains("\"level\":\"warn\""))
        .collect();
    assert!(warned.is_empty(), "{warned:?}");
    assert_eq!(srv.get("/healthz").status, 200);
}

#[test]
fn a_data_directory_whose_parent_is_missing_is_refused_not_created_whole() {
    let root = Dir::created("parent");
    let mistyped = root.0.join("vra/lib/relay");
    let (status, stderr) = run_to_exit(&[], &[("RELAY_DATA_DIR", mistyped.to_str().unwrap())]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    let parent = root.0.join("vra/lib");
    assert!(
        stderr.contains(&format!(
            "its parent directory {} does not exist",
            parent.display()
        )),
        "{stderr}"
    );
    assert!(!root.0.join("vra").exists(), "nothing was created");
}

#[test]
fn only_the_last_component_of_a_data_directory_is_created() {
    let root = Dir::created("last");
    let data = root.0.join("data");
    let srv = Server::start_single_with(&[("RELAY_DATA_DIR", data.to_str().unwrap())]);
    srv.wait_for_log("created the data directory");
    assert!(data.join("relay.db").is_file());
}

#[test]
fn a_data_directory_the_server_cannot_write_names_the_user_and_the_fix() {
    let dir = Dir::created("mode0500");
    let status = Command::new("chmod")
        .args(["0500", dir.path()])
        .status()
        .unwrap();
    assert!(status.success());
    // Root ignores permission bits: as root the server runs as nobody, when
    // setpriv is there to make it so.
    let root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    let nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    let wrapper: &[&str] = match root {
        false => &[],
        true if Command::new("setpriv").arg("--help").output().is_ok() => &nobody,
        true => {
            eprintln!("skipped: running as root (permissions do not bite) and no setpriv");
            return;
        }
    };
    let (status, stderr) = run_to_exit(wrapper, &[("RELAY_DATA_DIR", dir.path())]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the data directory {} is not writable",
            dir.path()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("relay runs as "), "{stderr}");
    assert!(stderr.contains("sudo chown "), "{stderr}");
    if root {
        assert!(
            stderr.contains(&format!("run `sudo chown nobody {}`", dir.path())),
            "{stderr}"
        );
    }
}
