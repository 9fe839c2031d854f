//! Issue 30 item 6: the live fleet page (`GET /ui`), rendered by headless Chromium against a real
//! 3-node raft fleet. The page names the leader the fleet agrees on; after `kill -9` of that
//! leader, a freshly opened page names the new one and shows the old one down, and a page left
//! open across the kill records the change. It also lists the resource's fence rejections.
//!
//! The page is read through the data attributes it renders (`data-leader`, `data-member`,
//! `data-up`, `data-role`), from Chromium's `--dump-dom` after a few polls (virtual time), and,
//! for the page left open, from the console lines it writes on each change it sees.

mod common;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Fleet;

/// Installed by `scripts/ensure-deps.sh` (Debian's `chromium`).
const CHROMIUM: &str = "/usr/bin/chromium";
/// Time to settle, elect, or show something on a loaded 2-core machine.
const SETTLE: Duration = Duration::from_secs(30);
/// Virtual time per dump: about three polls of the page (it polls every second).
const DUMP_VIRTUAL_MS: u32 = 3000;

/// The Chromium flags every run shares: headless, no GPU, no sandbox (tests run as root), and a
/// profile of its own, so two instances never share one.
fn chromium(profile: &Path) -> Command {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: run scripts/ensure-deps.sh"
    );
    let mut cmd = Command::new(CHROMIUM);
    cmd.args(["--headless", "--disable-gpu", "--no-sandbox"])
        .arg(format!("--user-data-dir={}", profile.display()));
    cmd
}

/// The page at `url` as Chromium renders it after [`DUMP_VIRTUAL_MS`] of virtual time.
fn dump_dom(url: &str) -> String {
    let profile = tempfile::tempdir().expect("tempdir");
    let out = chromium(profile.path())
        .arg("--dump-dom")
        .arg(format!("--virtual-time-budget={DUMP_VIRTUAL_MS}"))
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium --dump-dom {url} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The start tags in `dom` that carry `marker` (e.g. `data-member="n1"`).
fn tags_with<'a>(dom: &'a str, marker: &str) -> Vec<&'a str> {
    dom.match_indices(marker)
        .filter_map(|(i, _)| {
            let start = dom[..i].rfind('<')?;
            let end = i + dom[i..].find('>')?;
            Some(&dom[start..end])
        })
        .collect()
}

/// Attribute `name` of a start tag.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let from = tag.find(&key)? + key.len();
    Some(&tag[from..from + tag[from..].find('"')?])
}

/// What a rendered page says, read from its data attributes.
#[derive(Debug, Default, PartialEq)]
struct PageView {
    /// `ok` once a poll was rendered (`loading`, `stale` otherwise).
    state: String,
    /// Shard 0's leader as the leaders table shows it, and whether a reachable member claims it.
    leader: String,
    leader_source: String,
    /// The summary's leader (the page's body): must agree with the table.
    summary_leader: String,
    /// Per member: (`up`, `role`).
    members: BTreeMap<String, (String, String)>,
    /// The fence rejections listed: (token, holder).
    rejections: Vec<(String, String)>,
}

fn read_page(dom: &str) -> PageView {
    let mut view = PageView::default();
    if let Some(body) = tags_with(dom, "<body").first() {
        view.state = attr(body, "data-state").unwrap_or_default().to_owned();
        view.summary_leader = attr(body, "data-leader").unwrap_or_default().to_owned();
    }
    if let Some(row) = tags_with(dom, "data-shard=\"0\"")
        .into_iter()
        .find(|t| t.starts_with("<tr"))
    {
        view.leader = attr(row, "data-leader").unwrap_or_default().to_owned();
        view.leader_source = attr(row, "data-source").unwrap_or_default().to_owned();
    }
    for row in tags_with(dom, "data-member=\"") {
        let field = |name| attr(row, name).unwrap_or_default().to_owned();
        view.members
            .insert(field("data-member"), (field("data-up"), field("data-role")));
    }
    for row in tags_with(dom, "data-rejected-holder=\"") {
        let field = |name| attr(row, name).unwrap_or_default().to_owned();
        view.rejections
            .push((field("data-rejected-token"), field("data-rejected-holder")));
    }
    view
}

/// The fleet's agreed leader and the page's view of it, dumped from a live node other than that
/// leader and `dead`, until `wanted(view, leader)` holds (the page, then the fleet, may need a
/// few polls to agree; a loaded machine may move leadership meanwhile), or a panic at `SETTLE`
/// with the last view and DOM. Returns the leader, its token, and the page's URL.
async fn shown(
    fleet: &Fleet,
    dead: Option<&str>,
    what: &str,
    wanted: impl Fn(&PageView, &str) -> bool,
) -> (String, i64, String) {
    let until = Instant::now() + SETTLE;
    loop {
        let (leader, _, token) = fleet.leader(SETTLE).await;
        let watcher = fleet
            .state()
            .nodes
            .into_iter()
            .find(|n| n.id != leader && Some(n.id.as_str()) != dead)
            .expect("a live follower");
        let url = format!("http://{}/ui", watcher.http_addr);
        let dom = tokio::task::block_in_place(|| dump_dom(&url));
        let view = read_page(&dom);
        if wanted(&view, &leader) {
            return (leader, token, url);
        }
        if Instant::now() >= until {
            panic!(
                "the page at {url} never showed {what} within {SETTLE:?}: last {view:?} \
                 (fleet leader {leader})\n{dom}\n{}",
                fleet.log_tails(20)
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A Chromium left open on a page, its console (stderr) in a file; killed with its whole
/// process group when dropped.
struct OpenPage {
    child: Child,
    console: tempfile::NamedTempFile,
    _profile: tempfile::TempDir,
}

impl OpenPage {
    fn open(url: &str) -> OpenPage {
        let profile = tempfile::tempdir().expect("tempdir");
        let console = tempfile::NamedTempFile::new().expect("tempfile");
        // A remote-debugging port keeps headless Chromium running (in real time) instead of
        // exiting after the load; the console goes to stderr with --enable-logging.
        let child = chromium(profile.path())
            .args([
                "--enable-logging=stderr",
                "--v=0",
                "--remote-debugging-port=0",
            ])
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(console.reopen().expect("reopen"))
            .process_group(0)
            .spawn()
            .expect("start chromium");
        OpenPage {
            child,
            console,
            _profile: profile,
        }
    }

    /// The page's own console lines (`baton-ui ...`), in order.
    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.console.path())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once("\"baton-ui ").map(|(_, rest)| rest))
            .map(|rest| rest.split("\", source:").next().unwrap_or(rest).to_owned())
            .collect()
    }

    /// Waits until a console line satisfies `wanted`, or panics at `SETTLE`.
    async fn until_line(&self, what: &str, wanted: impl Fn(&str) -> bool) {
        let until = Instant::now() + SETTLE;
        while !self.lines().iter().any(|l| wanted(l)) {
            assert!(
                Instant::now() < until,
                "the open page never logged {what} within {SETTLE:?}: {:?}",
                self.lines()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for OpenPage {
    fn drop(&mut self) {
        // The browser and its renderers: the group this one leads (process_group(0)).
        // SAFETY: kill(2) on the group of a child this test started; no memory is touched.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_page_shows_the_new_leader_after_the_old_one_is_killed() {
    let fleet = Fleet::raft_at_twice_the_timing(3);
    fleet.settled_leader(SETTLE, Duration::from_secs(1)).await;
    let ids: Vec<String> = fleet.state().nodes.iter().map(|n| n.id.clone()).collect();
    // A refusal as the resource records it (a stale writer's claim would add the same row): the
    // page lists the resource's own record.
    fleet
        .admin_db()
        .await
        .execute(
            "INSERT INTO baton.fence_rejections (resource, token, max_token, holder, max_holder, op, reason)
             VALUES ('sequence', 1, 2, 'gone-node', 'n1', 'claim', 'stale-token')",
            &[],
        )
        .await
        .expect("record a rejection");
    let rejection = ("1".to_owned(), "gone-node".to_owned());

    let (old, old_token, url) = shown(
        &fleet,
        None,
        "the leader, 3 members up, the rejection",
        |v, leader| {
            v.state == "ok"
                && v.rejections.contains(&rejection)
                && v.leader == leader
                && v.leader_source == "claimed"
                && v.summary_leader == leader
                && ids.iter().all(|id| {
                    v.members.get(id).is_some_and(|(up, role)| {
                        up == "true" && (role == "leader") == (id.as_str() == leader)
                    })
                })
        },
    )
    .await;

    // Left open on a node that stays up, across the kill.
    let open = OpenPage::open(&url);
    let old_term = format!("shard 0: {old} (token {old_token})");
    open.until_line("the leader it opened with", |l| {
        l.starts_with("leaders at open:") && l.contains(&old_term)
    })
    .await;

    fleet.kill9(&old);
    fleet.new_leader(&old, old_token, SETTLE).await;
    let (new, new_token, _) = shown(
        &fleet,
        Some(&old),
        &format!("a new leader, {old} down"),
        |v, leader| {
            leader != old
                && v.state == "ok"
                && v.leader == leader
                && v.leader_source == "claimed"
                && v.summary_leader == leader
                && v.members.get(&old) == Some(&("false".into(), "down".into()))
                && v.members
                    .get(leader)
                    .is_some_and(|(up, role)| up == "true" && role == "leader")
        },
    )
    .await;

    // The page left open saw the old term end and the new one begin (directly, or through a
    // poll that saw no leader in between).
    open.until_line(&format!("a change away from {old}"), |l| {
        l.starts_with("leadership change:") && l.contains(&format!("{old_term} →"))
    })
    .await;
    let new_term = format!("→ {new} (token {new_token})");
    open.until_line(&format!("a change to {new}"), |l| {
        l.starts_with("leadership change:") && l.ends_with(&new_term)
    })
    .await;
}
