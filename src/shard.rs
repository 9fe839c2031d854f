//! Shards: K independent terms of leadership in one fleet (Kafka's partition leader epochs, in
//! baton's terms). A shard is a term like any other: its own election, token, watchdog,
//! leadership mirror and fence domain. With K = 1 there is exactly one, shard 0, and everything
//! is named as it was before shards existed.
//!
//! This module is pure (no I/O, imports nothing from baton): the names a shard's state lives
//! under, the documented key → shard hash, and the placement rule every node computes alike.
//!
//! # Naming
//!
//! Shard 0 uses the unsuffixed names (the election key, the fenced resources), so a K = 1 fleet
//! is exactly today's, and growing K keeps shard 0's history. Shard `s ≥ 1` appends `#s` to every
//! fenced resource name (`sequence#3`), which also selects the fence row `leadership#3` inside
//! PostgreSQL (`baton.fence_domain(resource)`), and a backend-specific suffix to its election
//! key ([`ShardId::election_suffix`]).
//!
//! # Placement: balanced rendezvous hashing
//!
//! Every node computes the same owner for every shard from the same sorted set of live members,
//! with no coordinator to elect or fail over: rendezvous (highest-random-weight) hashing ranks
//! the members for each shard, and a load bound turns it into a balanced assignment — shards are
//! placed in order, each on its highest-ranked member that still has room, where "room" allows
//! exactly `K mod N` members to take `⌈K/N⌉` shards and the rest `⌊K/N⌋`. So max − min ≤ 1
//! whenever views agree, and a join or leave moves about K/N shards (the ones whose ranking
//! changes at the top, plus a few the load bound pushes along), not all of them. Views that
//! disagree for a moment (one node has seen a join, another not yet) can make two nodes campaign
//! for one shard: the backend still elects exactly one, and the fence refuses the other.
//! We chose this over an elected coordinator because a coordinator is a second leader to fail
//! over (and to fence) before any shard can move.

use std::fmt;

/// A shard number, `0..K`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct ShardId(pub u32);

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl ShardId {
    /// Shard 0: the only shard of a K = 1 fleet.
    pub const ZERO: ShardId = ShardId(0);

    /// The fenced resource `name` as this shard writes it: `name` for shard 0, `name#s` else.
    /// PostgreSQL derives the shard's fence row from the same suffix.
    pub fn resource(self, name: &str) -> String {
        match self.0 {
            0 => name.to_owned(),
            s => format!("{name}#{s}"),
        }
    }

    /// What a backend appends to its election key for this shard (`""` for shard 0, else
    /// `-shard-s`): keeps shard 0's key unchanged and every shard's key distinct.
    pub fn election_suffix(self) -> String {
        match self.0 {
            0 => String::new(),
            s => format!("-shard-{s}"),
        }
    }
}

/// The shard a fenced resource name belongs to: its `#S` suffix (S ≥ 1, at most 10 digits),
/// else shard 0 — the same rule as `baton.fence_domain(resource)` in PostgreSQL.
pub fn shard_of_resource(name: &str) -> ShardId {
    match name.rsplit_once('#') {
        Some((_, digits))
            if (1..=10).contains(&digits.len())
                && !digits.starts_with('0')
                && digits.bytes().all(|b| b.is_ascii_digit()) =>
        {
            digits.parse::<u32>().map(ShardId).unwrap_or(ShardId::ZERO)
        }
        _ => ShardId::ZERO,
    }
}

/// FNV-1a, 64 bit: the documented, version-stable hash behind `?key=` and placement ranks.
/// (std's `DefaultHasher` may change between Rust releases; a client computing shards itself
/// needs a hash that never does.)
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The shard a client key belongs to: `fnv1a64(key) mod K`. Stable across versions.
pub fn shard_of_key(key: &[u8], shards: u32) -> ShardId {
    ShardId((fnv1a64(key) % u64::from(shards.max(1))) as u32)
}

/// A member's rendezvous weight for `shard`: the FNV-1a hash of `"<member>/<shard>"`, mixed
/// (FNV's low bits are weak on short inputs) with a 64-bit finalizer.
fn weight(member: &str, shard: ShardId) -> u64 {
    let mut h = fnv1a64(format!("{member}/{}", shard.0).as_bytes());
    // splitmix64's finalizer.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Members ranked for `shard`, best first (ties broken by id, so the order is total).
pub fn rank<'a>(members: &[&'a str], shard: ShardId) -> Vec<&'a str> {
    let mut ranked: Vec<&str> = members.to_vec();
    ranked.sort_by(|a, b| weight(b, shard).cmp(&weight(a, shard)).then(a.cmp(b)));
    ranked
}

/// The owner of each of `shards` shards among `members` (balanced rendezvous, see the module
/// docs); `owners[s]` is shard `s`'s owner. Empty `members` gives an empty vector. Deterministic
/// in the *set* of members: their order does not matter.
pub fn assign(members: &[&str], shards: u32) -> Vec<String> {
    let mut members: Vec<&str> = members.to_vec();
    members.sort_unstable();
    members.dedup();
    if members.is_empty() {
        return Vec::new();
    }
    let n = members.len() as u32;
    let (base, extra) = (shards / n, shards % n);
    let mut load: std::collections::HashMap<&str, u32> = members.iter().map(|m| (*m, 0)).collect();
    let mut at_ceiling = 0u32;
    let mut owners = Vec::with_capacity(shards as usize);
    for s in 0..shards {
        let shard = ShardId(s);
        let room = |m: &str, load: &std::collections::HashMap<&str, u32>, at_ceiling: u32| {
            let l = load[m];
            l < base || (l == base && at_ceiling < extra)
        };
        let owner = rank(&members, shard)
            .into_iter()
            .find(|m| room(m, &load, at_ceiling))
            .expect("total room equals the number of shards");
        let l = load.get_mut(owner).expect("a member");
        *l += 1;
        if *l == base + 1 {
            at_ceiling += 1;
        }
        owners.push(owner.to_owned());
    }
    owners
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(owners: &[String], members: &[&str]) -> Vec<usize> {
        members
            .iter()
            .map(|m| owners.iter().filter(|o| o == m).count())
            .collect()
    }

    #[test]
    fn resource_names_keep_shard_zero_unchanged() {
        assert_eq!(ShardId(0).resource("sequence"), "sequence");
        assert_eq!(ShardId(3).resource("sequence"), "sequence#3");
        assert_eq!(ShardId(0).election_suffix(), "");
        assert_eq!(ShardId(12).election_suffix(), "-shard-12");
    }

    #[test]
    fn a_resource_names_its_shard_by_suffix() {
        for s in [0u32, 1, 7, 4095] {
            assert_eq!(
                shard_of_resource(&ShardId(s).resource("sequence")),
                ShardId(s)
            );
        }
        assert_eq!(shard_of_resource("orders#0"), ShardId::ZERO);
        assert_eq!(shard_of_resource("orders#07"), ShardId::ZERO);
        assert_eq!(shard_of_resource("orders#x1"), ShardId::ZERO);
        assert_eq!(shard_of_resource("a#b#12"), ShardId(12));
    }

    #[test]
    fn the_key_hash_is_the_documented_fnv1a() {
        // Published FNV-1a 64 test vectors: a client may rely on these.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(
            shard_of_key(b"foobar", 16),
            ShardId((0x8594_4171_f739_67e8u64 % 16) as u32)
        );
        assert_eq!(shard_of_key(b"anything", 1), ShardId(0));
    }

    #[test]
    fn balance_is_within_one_for_every_k_and_n() {
        let names: Vec<String> = (1..=9).map(|i| format!("n{i}")).collect();
        for n in 1..=9usize {
            let members: Vec<&str> = names[..n].iter().map(String::as_str).collect();
            for k in [1u32, 2, 3, 7, 16, 64, 256, 1024] {
                let owners = assign(&members, k);
                assert_eq!(owners.len(), k as usize);
                let c = counts(&owners, &members);
                let (max, min) = (*c.iter().max().unwrap(), *c.iter().min().unwrap());
                if k as usize >= n {
                    assert!(max - min <= 1, "k={k} n={n}: {c:?}");
                } else {
                    assert!(max <= 1, "k={k} n={n}: {c:?}");
                }
            }
        }
    }

    #[test]
    fn order_of_members_does_not_matter() {
        let a = assign(&["n1", "n2", "n3"], 64);
        let b = assign(&["n3", "n1", "n2", "n1"], 64);
        assert_eq!(a, b);
    }

    #[test]
    fn a_join_or_leave_moves_about_k_over_n() {
        let nine: Vec<String> = (1..=9).map(|i| format!("n{i}")).collect();
        let nine: Vec<&str> = nine.iter().map(String::as_str).collect();
        for k in [64u32, 256] {
            let before = assign(&nine[..8], k);
            let after = assign(&nine, k);
            let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
            // Ideal: k/9 (the new member's share). The load bound pushes a few more along.
            let ideal = k as usize / 9;
            assert!(
                moved >= ideal && moved <= 2 * ideal + 2,
                "k={k}: moved {moved}, ideal {ideal}"
            );
            let leave = assign(&nine[1..], k);
            let moved = after.iter().zip(&leave).filter(|(a, b)| a != b).count();
            assert!(moved <= 2 * ideal + 2, "k={k}: leave moved {moved}");
        }
    }
}
