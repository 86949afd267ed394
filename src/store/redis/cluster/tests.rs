//! The router's unit tests, on a virtual clock and no sockets: frames
//! found across reads, calls routed by slot with replies in order,
//! redirections, lost masters, `WAIT`, the set-up replayed, the events
//! link's `PING` barrier and restarts, and the map of a node without
//! cluster support.

use super::*;
use crate::store::redis::slot::slot_of;

fn cmd(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    push_command(&mut out, args);
    out
}

fn slots_reply(ranges: &[(u16, u16, &str, u16)]) -> Vec<u8> {
    let mut r = format!("*{}\r\n", ranges.len());
    for (a, b, h, p) in ranges {
        r += &format!(
            "*3\r\n:{a}\r\n:{b}\r\n*3\r\n${}\r\n{h}\r\n:{p}\r\n$2\r\nid\r\n",
            h.len()
        );
    }
    r.into_bytes()
}

/// A key whose slot lies in `a..=b`.
fn key_in(a: u16, b: u16) -> Vec<u8> {
    (0..)
        .map(|i| format!("k{i}").into_bytes())
        .find(|k| (a..=b).contains(&slot_of(k)))
        .unwrap_or_default()
}

fn fcall(key: &[u8]) -> Vec<u8> {
    cmd(&[b"FCALL", b"f", b"1", key, b"x"])
}

const T: Millis = Millis(1000);

/// A router on three masters (n1, n2, n3 with a third of the slots
/// each), every socket open, the engine's links connected.
fn three() -> Router {
    let url = RedisUrl::parse("redis-cluster://n1:1").unwrap();
    let mut r = Router::new(&[("n1".into(), 1)], &url);
    r.opened(0, Sock::Command, T);
    assert_eq!(
        r.take_output(0, Sock::Command),
        cmd(&[b"CLUSTER", b"SLOTS"])
    );
    let map = slots_reply(&[
        (0, 5460, "n1", 1),
        (5461, 10922, "n2", 2),
        (10923, 16383, "n3", 3),
    ]);
    r.input(0, Sock::Command, &map, T).unwrap();
    assert_eq!(r.nodes().len(), 3);
    assert_eq!(r.take_notices(), vec![Notice::Connected(Link::Command)]);
    for i in 1..3 {
        r.opened(i, Sock::Command, T);
    }
    for i in 0..3 {
        assert!(r.wants(i, Sock::Events));
        r.opened(i, Sock::Events, T);
    }
    assert_eq!(r.take_notices(), vec![Notice::Connected(Link::Events)]);
    r
}

#[test]
fn frames_are_found_whole_across_reads() {
    let frame = b"*3\r\n$5\r\nhello\r\n:1\r\n*2\r\n+a\r\n$-1\r\n";
    for cut in 0..frame.len() {
        let mut s = Scan::default();
        let first = scan(&frame[..cut], &mut s).unwrap();
        assert_eq!(first, None, "cut at {cut}");
        assert_eq!(scan(frame, &mut s).unwrap(), Some(frame.len()));
    }
    assert!(scan(b"?x\r\n", &mut Scan::default()).is_err());
    assert!(scan(b"$3\r\nabcde\r\n", &mut Scan::default()).is_err());
}

#[test]
fn calls_go_by_slot_and_replies_come_back_in_order() {
    let mut r = three();
    let (k1, k3) = (key_in(0, 5460), key_in(10923, 16383));
    let mut out = fcall(&k3);
    out.extend(fcall(&k1));
    r.from_engine(Link::Command, &out, T);
    assert_eq!(r.take_output(2, Sock::Command), fcall(&k3));
    assert_eq!(r.take_output(0, Sock::Command), fcall(&k1));
    r.input(0, Sock::Command, b"+one\r\n", T).unwrap();
    assert!(r.take_engine_input(Link::Command).is_empty());
    r.input(2, Sock::Command, b"+three\r\n", T).unwrap();
    assert_eq!(r.take_engine_input(Link::Command), b"+three\r\n+one\r\n");
}

#[test]
fn moved_updates_the_map_and_sends_again_in_order() {
    let mut r = three();
    let k = key_in(0, 5460);
    let slot = slot_of(&k);
    let a = fcall(&k);
    let b = cmd(&[b"FCALL", b"g", b"1", &k]);
    r.from_engine(Link::Command, &[a.clone(), b.clone()].concat(), T);
    assert_eq!(
        r.take_output(0, Sock::Command),
        [a.clone(), b.clone()].concat()
    );
    let moved = format!("-MOVED {slot} n2:2\r\n");
    r.input(0, Sock::Command, moved.as_bytes(), T).unwrap();
    // A third call for the slot waits behind the second, still in
    // flight on n1.
    let c = cmd(&[b"FCALL", b"h", b"1", &k]);
    r.from_engine(Link::Command, &c, T);
    assert!(r.take_output(1, Sock::Command).is_empty());
    r.input(0, Sock::Command, moved.as_bytes(), T).unwrap();
    assert_eq!(r.take_output(1, Sock::Command), [a, b, c].concat());
    r.input(1, Sock::Command, b":1\r\n:2\r\n:3\r\n", T).unwrap();
    assert_eq!(r.take_engine_input(Link::Command), b":1\r\n:2\r\n:3\r\n");
    // The map says so now.
    r.from_engine(Link::Command, &fcall(&k), T);
    assert_eq!(r.take_output(1, Sock::Command), fcall(&k));
    assert!(r.next_deadline().is_some(), "a refresh of the map is due");
}

#[test]
fn ask_sends_asking_and_the_call_once() {
    let mut r = three();
    let k = key_in(0, 5460);
    r.from_engine(Link::Command, &fcall(&k), T);
    r.take_output(0, Sock::Command);
    let ask = format!("-ASK {} n3:3\r\n", slot_of(&k));
    r.input(0, Sock::Command, ask.as_bytes(), T).unwrap();
    let sent = r.take_output(2, Sock::Command);
    assert_eq!(sent, [cmd(&[b"ASKING"]), fcall(&k)].concat());
    r.input(2, Sock::Command, b"+OK\r\n:7\r\n", T).unwrap();
    assert_eq!(r.take_engine_input(Link::Command), b":7\r\n");
    // The map is unchanged.
    r.from_engine(Link::Command, &fcall(&k), T);
    assert_eq!(r.take_output(0, Sock::Command), fcall(&k));
}

#[test]
fn tryagain_is_sent_again_later() {
    let mut r = three();
    let k = key_in(0, 5460);
    r.from_engine(Link::Command, &fcall(&k), T);
    r.take_output(0, Sock::Command);
    r.input(0, Sock::Command, b"-TRYAGAIN busy\r\n", T).unwrap();
    assert!(r.take_output(0, Sock::Command).is_empty());
    r.tick(Millis(T.0 + 10));
    assert!(r.take_output(0, Sock::Command).is_empty());
    let due = r.held.front().map(|h| h.at).unwrap();
    r.tick(due);
    assert_eq!(r.take_output(0, Sock::Command), fcall(&k));
    r.input(0, Sock::Command, b"+done\r\n", due).unwrap();
    assert_eq!(r.take_engine_input(Link::Command), b"+done\r\n");
}

#[test]
fn a_lost_master_answers_relaylost_in_place_and_wait_counts_it_zero() {
    let mut r = three();
    let (k1, k2) = (key_in(0, 5460), key_in(5461, 10922));
    let out = [fcall(&k1), fcall(&k2), cmd(&[b"WAIT", b"1", b"100"])].concat();
    r.from_engine(Link::Command, &out, T);
    r.input(1, Sock::Command, b":2\r\n", T).unwrap();
    r.closed(0, Sock::Command, T);
    let got = r.take_engine_input(Link::Command);
    assert!(
        got.starts_with(b"-RELAYLOST "),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(got.ends_with(b"\r\n:2\r\n"));
    // n2 answers its WAIT with 1; n1 counted 0.
    r.input(1, Sock::Command, b":1\r\n", T).unwrap();
    assert_eq!(r.take_engine_input(Link::Command), b":0\r\n");
    // Its slots have no master that can be reached now.
    r.from_engine(Link::Command, &fcall(&k1), T);
    let got = r.take_engine_input(Link::Command);
    assert!(got.starts_with(b"-CLUSTERDOWN"));
    assert_eq!(r.take_notices(), vec![], "the command link stays up");
    // No write since: WAIT answers at once.
    r.from_engine(Link::Command, &cmd(&[b"WAIT", b"1", b"100"]), T);
    assert_eq!(r.take_engine_input(Link::Command), b":1\r\n");
}

#[test]
fn wait_goes_to_the_masters_written_to_and_the_least_count_wins() {
    let mut r = three();
    let (k1, k3) = (key_in(0, 5460), key_in(10923, 16383));
    let read = cmd(&[b"FCALL_RO", b"f", b"1", &k1]);
    let out = [
        read.clone(),
        fcall(&k3),
        fcall(&k1),
        cmd(&[b"WAIT", b"2", b"50"]),
    ]
    .concat();
    r.from_engine(Link::Command, &out, T);
    let wait = cmd(&[b"WAIT", b"2", b"50"]);
    assert_eq!(
        r.take_output(0, Sock::Command),
        [read, fcall(&k1), wait.clone()].concat()
    );
    assert!(
        r.take_output(1, Sock::Command).is_empty(),
        "n2 was not written to"
    );
    assert_eq!(r.take_output(2, Sock::Command), [fcall(&k3), wait].concat());
    r.input(0, Sock::Command, b"$1\r\nr\r\n:1\r\n:2\r\n", T)
        .unwrap();
    r.input(2, Sock::Command, b":3\r\n:1\r\n", T).unwrap();
    assert_eq!(
        r.take_engine_input(Link::Command),
        b"$1\r\nr\r\n:3\r\n:1\r\n:1\r\n"
    );
}

#[test]
fn set_up_goes_to_every_master_once_answered_and_is_replayed() {
    let mut r = three();
    let load = cmd(&[b"SCRIPT", b"LOAD", b"return 1"]);
    r.from_engine(Link::Command, &load, T);
    for i in 0..3 {
        assert_eq!(r.take_output(i, Sock::Command), load);
    }
    r.input(0, Sock::Command, b"$3\r\nabc\r\n", T).unwrap();
    r.input(1, Sock::Command, b"-ERR no\r\n", T).unwrap();
    assert!(r.take_engine_input(Link::Command).is_empty());
    r.input(2, Sock::Command, b"$3\r\nabc\r\n", T).unwrap();
    assert_eq!(r.take_engine_input(Link::Command), b"-ERR no\r\n");
    // n2 connects again: the set-up is replayed, its reply swallowed.
    r.closed(1, Sock::Command, T);
    r.opened(1, Sock::Command, T);
    assert_eq!(r.take_output(1, Sock::Command), load);
    let k2 = key_in(5461, 10922);
    r.from_engine(Link::Command, &fcall(&k2), T);
    r.input(1, Sock::Command, b"$3\r\nabc\r\n:5\r\n", T)
        .unwrap();
    assert_eq!(r.take_engine_input(Link::Command), b":5\r\n");
}

#[test]
fn a_ping_is_answered_once_every_master_answered_and_frames_pass_whole() {
    let mut r = three();
    let ch = key_in(10923, 16383);
    r.from_engine(Link::Events, &cmd(&[b"SSUBSCRIBE", &ch]), T);
    assert_eq!(r.take_output(2, Sock::Events), cmd(&[b"SSUBSCRIBE", &ch]));
    r.from_engine(Link::Events, &cmd(&[b"PING"]), T);
    for i in 0..3 {
        assert!(r.take_output(i, Sock::Events).ends_with(&cmd(&[b"PING"])));
    }
    let sub = format!(
        "*3\r\n$10\r\nssubscribe\r\n${}\r\n{}\r\n:1\r\n",
        ch.len(),
        String::from_utf8_lossy(&ch)
    );
    let msg = format!(
        "*3\r\n$8\r\nsmessage\r\n${}\r\n{}\r\n$2\r\nhi\r\n",
        ch.len(),
        String::from_utf8_lossy(&ch)
    );
    r.input(0, Sock::Events, b"+PONG\r\n", T).unwrap();
    let (first, rest) = msg.as_bytes().split_at(10);
    r.input(2, Sock::Events, &[sub.as_bytes(), first].concat(), T)
        .unwrap();
    assert_eq!(r.take_engine_input(Link::Events), sub.as_bytes());
    r.input(2, Sock::Events, rest, T).unwrap();
    r.input(2, Sock::Events, b"*2\r\n$4\r\npong\r\n$0\r\n\r\n", T)
        .unwrap();
    assert_eq!(r.take_engine_input(Link::Events), msg.as_bytes());
    r.input(1, Sock::Events, b"+PONG\r\n", T).unwrap();
    assert_eq!(
        r.take_engine_input(Link::Events),
        b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"
    );
}

#[test]
fn an_unsolicited_sunsubscribe_starts_the_events_link_again() {
    let mut r = three();
    let ch = key_in(0, 5460);
    r.from_engine(Link::Events, &cmd(&[b"SSUBSCRIBE", &ch]), T);
    let gone = format!(
        "*3\r\n$12\r\nsunsubscribe\r\n${}\r\n{}\r\n:0\r\n",
        ch.len(),
        String::from_utf8_lossy(&ch)
    );
    r.input(0, Sock::Events, gone.as_bytes(), T).unwrap();
    assert_eq!(r.take_notices(), vec![Notice::Lost(Link::Events)]);
    for i in 0..3 {
        assert!(r.take_drop(i), "node {i}'s events socket starts again");
        r.opened(i, Sock::Events, T);
    }
    assert_eq!(r.take_notices(), vec![Notice::Connected(Link::Events)]);
}

#[test]
fn a_moved_subscription_starts_the_events_link_again_and_reads_the_map() {
    let mut r = three();
    let ch = key_in(0, 5460);
    r.from_engine(Link::Events, &cmd(&[b"SSUBSCRIBE", &ch]), T);
    assert_eq!(r.take_output(0, Sock::Events), cmd(&[b"SSUBSCRIBE", &ch]));
    let moved = format!("-MOVED {} n2:2\r\n", slot_of(&ch));
    r.input(0, Sock::Events, moved.as_bytes(), T).unwrap();
    assert!(
        r.take_engine_input(Link::Events).is_empty(),
        "never the engine's"
    );
    assert_eq!(r.take_notices(), vec![Notice::Lost(Link::Events)]);
    let due = r.next_deadline().expect("the map is read again");
    r.tick(due);
    let asked = (0..3).any(|i| r.take_output(i, Sock::Command) == cmd(&[b"CLUSTER", b"SLOTS"]));
    assert!(asked);
}

#[test]
fn a_node_without_cluster_support_owns_every_slot() {
    let url = RedisUrl::parse("redis-cluster://:pw@solo:9").unwrap();
    let mut r = Router::new(&[("solo".into(), 9)], &url);
    r.opened(0, Sock::Command, T);
    let out = r.take_output(0, Sock::Command);
    assert_eq!(
        out,
        [cmd(&[b"AUTH", b"pw"]), cmd(&[b"CLUSTER", b"SLOTS"])].concat()
    );
    r.input(
        0,
        Sock::Command,
        b"+OK\r\n-ERR This instance has cluster support disabled\r\n",
        T,
    )
    .unwrap();
    assert_eq!(r.take_notices(), vec![Notice::Connected(Link::Command)]);
    for k in [b"a".as_slice(), b"b", b"zz"] {
        r.from_engine(Link::Command, &fcall(k), T);
        assert_eq!(r.take_output(0, Sock::Command), fcall(k));
    }
}

#[test]
fn what_the_engine_sends_while_the_map_is_read_waits_for_it() {
    // The engine's link is up once the seed's socket is: its set-up
    // and first calls, sent before `CLUSTER SLOTS` is answered, go out
    // once it is, in order, and none is refused.
    let url = RedisUrl::parse("redis-cluster://solo:9").unwrap();
    let mut r = Router::new(&[("solo".into(), 9)], &url);
    r.opened(0, Sock::Command, T);
    assert_eq!(r.take_notices(), vec![Notice::Connected(Link::Command)]);
    let setup = cmd(&[b"SCRIPT", b"LOAD", b"s"]);
    let sent = [setup.clone(), fcall(b"a"), fcall(b"zz")].concat();
    r.from_engine(Link::Command, &sent, T);
    assert_eq!(
        r.take_output(0, Sock::Command),
        cmd(&[b"CLUSTER", b"SLOTS"])
    );
    assert!(r.take_engine_input(Link::Command).is_empty());
    let disabled = b"-ERR This instance has cluster support disabled\r\n";
    r.input(0, Sock::Command, disabled, T).unwrap();
    assert_eq!(r.take_output(0, Sock::Command), sent);
    r.input(0, Sock::Command, b"$1\r\ns\r\n:1\r\n:2\r\n", T)
        .unwrap();
    assert_eq!(
        r.take_engine_input(Link::Command),
        b"$1\r\ns\r\n:1\r\n:2\r\n"
    );
    assert!(r.take_notices().is_empty());
}

#[test]
fn masters_still_connecting_keep_the_calls_and_a_lost_one_refuses_them() {
    // The map names masters other than the seed: calls for them wait
    // on their sockets while they connect; one that cannot be reached
    // answers in place, and the link goes once none can.
    let url = RedisUrl::parse("redis-cluster://seed:1").unwrap();
    let mut r = Router::new(&[("seed".into(), 1)], &url);
    r.opened(0, Sock::Command, T);
    r.take_output(0, Sock::Command);
    let map = slots_reply(&[(0, 8191, "m1", 2), (8192, 16383, "m2", 3)]);
    r.input(0, Sock::Command, &map, T).unwrap();
    assert_eq!(r.take_notices(), vec![Notice::Connected(Link::Command)]);
    let (k1, k2) = (key_in(0, 8191), key_in(8192, 16383));
    r.from_engine(Link::Command, &[fcall(&k1), fcall(&k2)].concat(), T);
    assert!(r.take_engine_input(Link::Command).is_empty());
    r.opened(1, Sock::Command, T);
    assert_eq!(r.take_output(1, Sock::Command), fcall(&k1));
    r.closed(2, Sock::Command, T);
    r.input(1, Sock::Command, b":1\r\n", T).unwrap();
    assert_eq!(
        r.take_engine_input(Link::Command),
        b":1\r\n-CLUSTERDOWN relay: no master for the slot\r\n"
    );
    assert!(r.take_notices().is_empty());
    r.closed(1, Sock::Command, T);
    assert_eq!(r.take_notices(), vec![Notice::Lost(Link::Command)]);
}

#[test]
fn a_connected_node_that_becomes_a_master_gets_the_set_up() {
    let mut r = three();
    let load = cmd(&[b"SCRIPT", b"LOAD", b"return 1"]);
    r.from_engine(Link::Command, &load, T);
    for i in 0..3 {
        r.take_output(i, Sock::Command);
        r.input(i, Sock::Command, b"$1\r\na\r\n", T).unwrap();
    }
    assert_eq!(r.take_engine_input(Link::Command), b"$1\r\na\r\n");
    // n3 moves a slot to n4, a node new to the router.
    let k = key_in(10923, 16383);
    r.from_engine(Link::Command, &fcall(&k), T);
    r.take_output(2, Sock::Command);
    let moved = format!("-MOVED {} n4:4\r\n", slot_of(&k));
    r.input(2, Sock::Command, moved.as_bytes(), T).unwrap();
    assert_eq!(r.take_notices(), vec![Notice::Lost(Link::Events)]);
    assert!(r.wants(3, Sock::Command));
    r.opened(3, Sock::Command, T);
    assert_eq!(r.take_output(3, Sock::Command), [load, fcall(&k)].concat());
    r.input(3, Sock::Command, b"$1\r\na\r\n:9\r\n", T).unwrap();
    assert_eq!(r.take_engine_input(Link::Command), b":9\r\n");
}

#[test]
fn a_broken_reply_drops_the_socket_without_a_panic() {
    let mut r = three();
    r.from_engine(Link::Command, &fcall(&key_in(0, 5460)), T);
    assert!(r.input(0, Sock::Command, b"?garbage\r\n", T).is_err());
    assert!(
        r.input(1, Sock::Command, b":1\r\n", T).is_err(),
        "nobody asked"
    );
}
