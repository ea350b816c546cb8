//! Tenants made of real Unix users and groups (root only: users and a group made with useradd
//! and groupadd): a tenant given by a group takes its members' jobs and nobody else's, a job
//! runs with its user's supplementary groups, and an admin named in the config sees every
//! tenant's jobs, by the API and on the web page, where a tenant sees its own alone.

use crate::browser::http;
use crate::serve::{Daemon, as_user, job_file, root_or_skip, test_user, world_dir};
use crate::tls::hashed;
use crate::*;
use std::process::Command;
use std::time::{Duration, Instant};

const ADMIN: &str = "admin-token-for-tenant-tests";
const SOLO: &str = "token-of-tenant-solo";

/// Runs an account tool (useradd, groupadd, usermod), again while another process holds the
/// account files' lock (tests of other checkouts may make users at the same time).
fn account_tool(program: &str, args: &[&str], done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program} runs: {e}"));
        if out.status.success() || done() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{program} {args:?}: {}",
            stderr(&out)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The gid of `name`, when the group exists.
fn gid_of(name: &str) -> Option<u32> {
    let out = Command::new("getent").args(["group", name]).output().ok()?;
    stdout(&out).split(':').nth(2)?.trim().parse().ok()
}

/// Makes (once) the group `name`; returns its gid.
fn test_group(name: &str) -> u32 {
    if gid_of(name).is_none() {
        account_tool("groupadd", &[name], || gid_of(name).is_some());
    }
    gid_of(name).expect("the group exists")
}

/// Whether `user` is a member of `group`, as the group database says.
fn member(user: &str, group: &str) -> bool {
    Command::new("id")
        .args(["-Gn", user])
        .output()
        .is_ok_and(|o| stdout(&o).split_whitespace().any(|g| g == group))
}

/// Makes (once) the user `name`, a member of `group`; returns (uid, gid).
fn user_in_group(name: &str, group: &str) -> (u32, u32) {
    let user = test_user(name);
    if !member(name, group) {
        account_tool("usermod", &["-aG", group, name], || member(name, group));
    }
    user
}

fn jobs_of(user: (u32, u32), d: &Daemon, cwd: &std::path::Path) -> Vec<serde_json::Value> {
    let out = as_user(user, &d.socket(), cwd, &["jobs", "--all", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn names(jobs: &[serde_json::Value]) -> Vec<String> {
    jobs.iter()
        .filter_map(|j| j["name"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn a_group_tenant_its_members_groups_and_what_an_admin_sees() {
    if !root_or_skip("a_group_tenant_its_members_groups_and_what_an_admin_sees") {
        return;
    }
    let lab_gid = test_group("orchtestlab");
    let member_user = user_in_group("orchtestg", "orchtestlab");
    let outsider = test_user("orchtesto");
    let solo = test_user("orchtesta");
    let admin = test_user("orchtestadm");
    assert!(!member("orchtesto", "orchtestlab"));

    let mut d = Daemon::prepare("group-tenants");
    let public = std::env::temp_dir().join(format!("orch-group-public-{}", std::process::id()));
    world_dir(&public);
    let port = free_port();
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "admins = [\"root\", \"orchtestadm\"]\nlisten = \"127.0.0.1:{port}\"\nadmin_tokens = [\"{}\"]\n\
             [[tenant]]\nname = \"lab\"\ngroups = [\"orchtestlab\"]\n\
             [[tenant]]\nname = \"solo\"\nusers = [\"orchtesta\"]\ntokens = [\"{}\"]\n",
            hashed(ADMIN),
            hashed(SOLO)
        ),
    )
    .unwrap();
    d.config = Some(config);
    d.socket = Some(public.join("orch.sock"));
    d.restart();
    let socket = d.socket();

    // a. The group's member is served as tenant "lab"; a user outside it (in no tenant) is not.
    let out = as_user(
        member_user,
        &socket,
        &public,
        &["submit", "--", "sh", "-c", "id -u; id -g; id -G"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    assert_eq!(d.status(&id)["tenant"], "lab");
    let out = as_user(outsider, &socket, &public, &["submit", "--", "true"]);
    assert!(!out.status.success(), "an outsider's job was accepted");
    assert!(
        stderr(&out).contains("user orchtesto is in no tenant"),
        "{}",
        stderr(&out)
    );
    let out = as_user(
        member_user,
        &socket,
        &public,
        &["submit", "--tenant", "solo", "--", "true"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is not in tenant \"solo\""),
        "{}",
        stderr(&out)
    );

    // b. The job ran as its user, with the group among its supplementary groups.
    let out = as_user(member_user, &socket, &public, &["wait", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let logs = stdout(&as_user(member_user, &socket, &public, &["logs", &id]));
    let lines: Vec<&str> = logs.lines().collect();
    assert_eq!(lines.len(), 3, "{logs}");
    assert_eq!(lines[0], member_user.0.to_string(), "id -u: {logs}");
    assert_eq!(lines[1], member_user.1.to_string(), "id -g: {logs}");
    let groups: Vec<u32> = lines[2]
        .split_whitespace()
        .map(|g| g.parse().unwrap())
        .collect();
    assert!(
        groups.contains(&lab_gid) && groups.contains(&member_user.1),
        "id -G {groups:?} lacks orchtestlab ({lab_gid}): {logs}"
    );
    assert!(
        !groups.contains(&0),
        "the job kept root's group: {groups:?}"
    );

    // c. Two tenants' running jobs, with names only their tenants (and admins) may read.
    let lab_job = job_file(
        &public,
        "lab.toml",
        "[job]\nname = \"lab-gamma-secret\"\n[resources]\ngpus = 1\n[command]\nargv = [\"sleep\", \"60\"]\n",
    );
    let solo_job = job_file(
        &public,
        "solo.toml",
        "[job]\nname = \"solo-delta-own\"\n[resources]\ngpus = 1\n[command]\nargv = [\"sleep\", \"60\"]\n",
    );
    let submit = |user, file: &str| {
        let out = as_user(user, &socket, &public, &["submit", file]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).trim().to_string()
    };
    let lab_id = submit(member_user, &lab_job);
    let solo_id = submit(solo, &solo_job);
    d.wait_state(&lab_id, "running");
    d.wait_state(&solo_id, "running");

    // Over the socket: the admin user lists both; each tenant its own alone.
    let seen = names(&jobs_of(admin, &d, &public));
    assert!(
        seen.contains(&"lab-gamma-secret".to_string())
            && seen.contains(&"solo-delta-own".to_string()),
        "the admin sees {seen:?}"
    );
    let seen = names(&jobs_of(solo, &d, &public));
    assert!(
        seen.contains(&"solo-delta-own".to_string())
            && !seen.contains(&"lab-gamma-secret".to_string()),
        "solo sees {seen:?}"
    );
    let seen = names(&jobs_of(member_user, &d, &public));
    assert!(
        seen.contains(&"lab-gamma-secret".to_string())
            && !seen.contains(&"solo-delta-own".to_string()),
        "lab sees {seen:?}"
    );
    let out = as_user(admin, &socket, &public, &["status", &lab_id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = as_user(solo, &socket, &public, &["status", &lab_id]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // On the web page: what its script loads, with an admin's session and with a tenant's.
    let session = |token: &str| {
        let login = http(
            port,
            "POST",
            "/login",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            format!("token={token}").as_bytes(),
        );
        assert_eq!(login.status, 303, "{}", login.text());
        let cookie = login.header("set-cookie").unwrap();
        cookie.split(';').next().unwrap().to_string()
    };
    let admin_session = session(ADMIN);
    let solo_session = session(SOLO);
    for cookie in [&admin_session, &solo_session] {
        let page = http(port, "GET", "/", &[("Cookie", cookie)], b"");
        assert_eq!(page.status, 200);
        assert!(
            page.text().contains("app.js") && !page.text().contains("id=\"login\""),
            "the dashboard, not the login form: {}",
            page.text()
        );
    }
    let page_jobs = |cookie: &str| {
        http(
            port,
            "GET",
            "/v1/jobs?events=true&all=true&recent=20",
            &[("Cookie", cookie)],
            b"",
        )
        .text()
    };
    let jobs = page_jobs(&admin_session);
    assert!(
        jobs.contains("lab-gamma-secret") && jobs.contains("solo-delta-own"),
        "{jobs}"
    );
    let jobs = page_jobs(&solo_session);
    assert!(
        jobs.contains("solo-delta-own") && !jobs.contains("lab-gamma-secret"),
        "{jobs}"
    );
    // The GPU table: the admin reads who holds each device; the tenant reads its own job's
    // name and "(another tenant's job)" for the other. The device watcher's next reading shows
    // the leases (a second at most).
    let devices =
        |cookie: &str| http(port, "GET", "/v1/devices", &[("Cookie", cookie)], b"").text();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = devices(&admin_session);
        if seen.contains("lab-gamma-secret") && seen.contains("solo-delta-own") {
            break;
        }
        assert!(Instant::now() < deadline, "the admin's devices: {seen}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let seen = devices(&solo_session);
    assert!(
        seen.contains("solo-delta-own")
            && seen.contains("(another tenant's job)")
            && !seen.contains("lab-gamma-secret"),
        "{seen}"
    );

    for id in [&lab_id, &solo_id] {
        assert!(d.client(&["cancel", id]).status.success());
        d.wait_state(id, "cancelled");
    }
}
