//! Buckets of sessions and the hash tags their keys carry in a Redis
//! Cluster, so that every key one script call touches lies in one hash
//! slot.
//!
//! In cluster mode (`redis-cluster://`) a session belongs to one of
//! [`BUCKETS`] buckets (FNV-1a of its id); every key of a session, and the
//! bucket's own index keys (its sessions by activity, its pending prompts
//! by arrival, its arrival counter and generation), start with the
//! bucket's base, `<prefix>{<tag>}`. Redis hashes only what is between the
//! braces, so a bucket is one slot. The tags are chosen so that bucket
//! `i`'s slot lies in the `i`-th of [`BUCKETS`] equal ranges of the 16,384
//! slots: however a cluster splits the slots into contiguous ranges (as
//! `redis-cli --cluster create` and `reshard` do), each master gets the
//! buckets of its share of the slots, within one bucket.
//!
//! The bucketed layout is cluster mode's only: one Redis and Sentinel keep
//! the layout without buckets (`<prefix>s:<sid>`, one `<prefix>sessions`),
//! so a relay on a plain Redis keeps the data it has, and its calls cost
//! what they did. The slot functions also serve the router, which sends
//! each command to the master of its first key's slot.

/// Buckets of sessions. More spread sessions more finely over masters
/// (each master gets its share of them within one); fewer keep the walks
/// over every bucket (the all-sessions read, the sweep, the probe) short.
pub const BUCKETS: usize = 64;

/// Hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// CRC16 (XMODEM: polynomial 0x1021, initial 0), as Redis Cluster hashes
/// keys.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot of `key`, with Redis's hash tag rule: if the key holds a `{`
/// followed later by a `}` with something between them, only that part is
/// hashed. What a cluster's router routes a command by.
#[allow(dead_code)]
pub fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// The bucket of session `sid`: FNV-1a (32 bits) of its id.
pub fn bucket_of(sid: &[u8]) -> usize {
    let mut h: u32 = 0x811c_9dc5;
    for &b in sid {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h as usize % BUCKETS
}

/// Sessions one bucket takes (Redis's side of `RELAY_MAX_SESSIONS`,
/// which no script can count across buckets): twice its share, at least
/// 64, never more than the cap itself. Sessions spread evenly, so Redis
/// refuses new ones from between one and two times the cap (with few
/// sessions, from one bucket's share on).
pub fn bucket_cap(max_sessions: usize) -> usize {
    (max_sessions.saturating_mul(2))
        .div_ceil(BUCKETS)
        .max(64)
        .min(max_sessions)
}

/// The tag of each bucket: for bucket `i`, the smallest number (written in
/// decimal) whose slot lies in the `i`-th of [`BUCKETS`] equal ranges of
/// the slots. Fixed by this rule, so every relay of this layout agrees.
pub fn tags() -> Vec<String> {
    let width = usize::from(SLOTS) / BUCKETS;
    let mut tags = vec![String::new(); BUCKETS];
    let mut left = BUCKETS;
    let mut k: u32 = 0;
    while left > 0 {
        let t = k.to_string();
        let b = usize::from(crc16(t.as_bytes()) % SLOTS) / width;
        if tags[b].is_empty() {
            tags[b] = t;
            left -= 1;
        }
        k += 1;
    }
    tags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_and_slots_are_redis_cluster_s() {
        // The check value of CRC16/XMODEM, and slots Redis's own
        // `CLUSTER KEYSLOT` gives.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot_of(b"foo{{bar}}zap"), crc16(b"{bar") % SLOTS);
    }

    #[test]
    fn each_bucket_is_one_slot_in_its_own_range() {
        let tags = tags();
        let width = SLOTS / BUCKETS as u16;
        for (i, t) in tags.iter().enumerate() {
            let s = slot_of(format!("relay:{{{t}}}s:abc").as_bytes());
            assert_eq!(s, slot_of(format!("relay:{{{t}}}pending").as_bytes()));
            assert_eq!(usize::from(s / width), i, "bucket {i}, tag {t}");
        }
    }

    #[test]
    fn a_bucket_takes_twice_its_share_of_the_cap_at_least_64_at_most_the_cap() {
        assert_eq!(bucket_cap(100_000), 3_125);
        assert_eq!(bucket_cap(10_000), 313);
        assert_eq!(bucket_cap(1_000), 64);
        assert_eq!(bucket_cap(2), 2);
        assert_eq!(bucket_cap(0), 0);
    }

    /// Three masters with the slot ranges `redis-cli --cluster create`
    /// gives them: sessions spread evenly, buckets within one of a third.
    #[test]
    fn sessions_spread_evenly_over_three_masters() {
        let ranges = [(0u16, 5460u16), (5461, 10922), (10923, 16383)];
        let master = |slot: u16| ranges.iter().position(|&(a, b)| (a..=b).contains(&slot));
        let tags = tags();
        let mut buckets = [0usize; 3];
        for t in &tags {
            let m = master(slot_of(format!("relay:{{{t}}}s:x").as_bytes()));
            buckets[m.expect("every slot has a master")] += 1;
        }
        for n in buckets {
            assert!(
                n.abs_diff(BUCKETS / 3) <= 1,
                "buckets per master {buckets:?}"
            );
        }
        let mut sessions = [0usize; 3];
        let n = 30_000;
        for i in 0..n {
            let sid = format!("session-{i}");
            let t = &tags[bucket_of(sid.as_bytes())];
            let key = format!("relay:{{{t}}}s:{sid}");
            sessions[master(slot_of(key.as_bytes())).unwrap_or(0)] += 1;
        }
        for s in sessions {
            // A third, within 5 %.
            assert!(
                s.abs_diff(n / 3) < n / 60,
                "sessions per master {sessions:?}"
            );
        }
    }
}
