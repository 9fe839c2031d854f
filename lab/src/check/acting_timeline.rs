//! `leaders_acting` by effect, from the ledger alone: for each (token, holder), the interval of
//! `committed_at` (the resource's clock) from its first to its last accepted write. At most one
//! leader acts at a time iff no two of these intervals interleave; an interleaving is a
//! double-acting incident *by effect*, whatever the nodes' own metrics said.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{fmt_us, CheckInput, Violation};

pub const NAME: &str = "acting_timeline";

/// One leader's span of accepted writes.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Interval {
    pub token: i64,
    pub holder: String,
    /// µs since the epoch, resource clock.
    pub first_us: i64,
    pub last_us: i64,
    pub first_pos: i64,
    pub last_pos: i64,
    pub writes: usize,
    /// Refusals recorded against this token (any holder).
    pub rejected: usize,
}

/// Intervals in order of their first write, and where two interleave.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timeline {
    pub intervals: Vec<Interval>,
    /// Pairs `(i, j)` of `intervals` indices with `i < j` where `j` started before `i` ended.
    pub interleavings: Vec<(usize, usize)>,
    pub rejections: usize,
}

pub fn timeline(input: &CheckInput) -> Timeline {
    let mut by_key: BTreeMap<(i64, &str), Interval> = BTreeMap::new();
    for r in &input.ledger {
        let iv = by_key
            .entry((r.token, r.holder.as_str()))
            .or_insert_with(|| Interval {
                token: r.token,
                holder: r.holder.clone(),
                first_us: r.committed_us,
                last_us: r.committed_us,
                first_pos: r.pos,
                last_pos: r.pos,
                writes: 0,
                rejected: 0,
            });
        iv.writes += 1;
        if r.committed_us < iv.first_us {
            iv.first_us = r.committed_us;
            iv.first_pos = r.pos;
        }
        if r.committed_us >= iv.last_us {
            iv.last_us = r.committed_us;
            iv.last_pos = r.pos;
        }
    }
    let mut intervals: Vec<Interval> = by_key.into_values().collect();
    for iv in &mut intervals {
        iv.rejected = input
            .rejections
            .iter()
            .filter(|x| x.token == iv.token)
            .count();
    }
    intervals.sort_by_key(|i| (i.first_us, i.first_pos));
    // Sweep: the interval reaching furthest so far; the next one must start at or after its end.
    let mut interleavings = Vec::new();
    let mut reach: Option<usize> = None;
    for j in 0..intervals.len() {
        if let Some(i) = reach {
            if intervals[j].first_us < intervals[i].last_us {
                interleavings.push((i, j));
            }
        }
        if reach.is_none_or(|i| intervals[j].last_us > intervals[i].last_us) {
            reach = Some(j);
        }
    }
    Timeline {
        intervals,
        interleavings,
        rejections: input.rejections.len(),
    }
}

pub fn check(input: &CheckInput) -> Option<Violation> {
    let t = timeline(input);
    let &(i, j) = t.interleavings.first()?;
    let (a, b) = (&t.intervals[i], &t.intervals[j]);
    Some(Violation::new(
        NAME,
        format!(
            "double-acting by effect: token {} ({}) wrote until {} (pos {}), after token {} ({}) started at {} (pos {}): {:.3} ms of overlap",
            a.token,
            a.holder,
            fmt_us(a.last_us),
            a.last_pos,
            b.token,
            b.holder,
            fmt_us(b.first_us),
            b.first_pos,
            (a.last_us - b.first_us) as f64 / 1000.0
        ),
        vec![
            format!("token {} ({}): {} writes, pos {}..{}", a.token, a.holder, a.writes, a.first_pos, a.last_pos),
            format!("token {} ({}): {} writes, pos {}..{}", b.token, b.holder, b.writes, b.first_pos, b.last_pos),
        ],
    ))
}

impl Timeline {
    /// The timeline as a table, times relative to the first write, and the dark time between
    /// consecutive leaders.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let Some(t0) = self.intervals.first().map(|i| i.first_us) else {
            return "leaders acting by effect: the ledger is empty\n".into();
        };
        out.push_str(&format!(
            "leaders acting by effect (fence_log committed_at, resource clock; t=0 at {} s since the epoch):\n",
            fmt_us(t0)
        ));
        out.push_str(&format!(
            "  {:>8} {:<10} {:>12} {:>12} {:>8} {:>9}  {}\n",
            "token", "holder", "first_ms", "last_ms", "writes", "rejected", "then"
        ));
        let rel = |us: i64| (us - t0) as f64 / 1000.0;
        for (k, iv) in self.intervals.iter().enumerate() {
            let then = match self.intervals.get(k + 1) {
                Some(n) if n.first_us >= iv.last_us => {
                    format!("dark {:.3} ms", (n.first_us - iv.last_us) as f64 / 1000.0)
                }
                Some(n) => format!(
                    "OVERLAPS next by {:.3} ms",
                    (iv.last_us - n.first_us) as f64 / 1000.0
                ),
                None => String::new(),
            };
            out.push_str(&format!(
                "  {:>8} {:<10} {:>12.3} {:>12.3} {:>8} {:>9}  {}\n",
                iv.token,
                iv.holder,
                rel(iv.first_us),
                rel(iv.last_us),
                iv.writes,
                iv.rejected,
                then
            ));
        }
        if self.interleavings.is_empty() {
            out.push_str(&format!(
                "interleaving: none ({} leaders, at most one acting at any time; {} refused writes)\n",
                self.intervals.len(),
                self.rejections
            ));
        } else {
            for &(i, j) in &self.interleavings {
                let (a, b) = (&self.intervals[i], &self.intervals[j]);
                out.push_str(&format!(
                    "interleaving: token {} ({}) still writing at {:.3} ms after token {} ({}) started at {:.3} ms: DOUBLE-ACTING\n",
                    a.token,
                    a.holder,
                    rel(a.last_us),
                    b.token,
                    b.holder,
                    rel(b.first_us)
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;
    use crate::check::Rejection;

    #[test]
    fn sequential_leaders_do_not_interleave() {
        let input = healthy();
        assert_eq!(check(&input), None);
        let t = timeline(&input);
        assert_eq!(t.intervals.len(), 2);
        assert_eq!((t.intervals[0].token, t.intervals[0].writes), (5, 3));
        assert_eq!((t.intervals[1].token, t.intervals[1].first_pos), (7, 4));
        let text = t.render();
        assert!(text.contains("dark 1.000 ms"), "{text}");
        assert!(text.contains("interleaving: none"), "{text}");
    }

    #[test]
    fn an_old_leader_writing_after_the_new_one_started_is_double_acting() {
        let mut input = healthy();
        // Token 5 writes to another resource after token 7 started (pos 4 = +4 ms).
        let mut row = next(5, 5, "n1", 0, 0);
        row.pos = 10;
        row.resource = "workset".into();
        row.op = "tick".into();
        row.committed_us = 1_700_000_000_000_000 + 4500;
        input.ledger.push(row);
        let v = check(&input).expect("violation");
        assert_eq!(v.invariant, NAME);
        assert!(
            v.message
                .starts_with("double-acting by effect: token 5 (n1) wrote until"),
            "{}",
            v.message
        );
        assert!(
            v.message.contains("token 7 (n2) started") && v.message.contains("0.500 ms of overlap"),
            "{}",
            v.message
        );
        assert!(timeline(&input).render().contains("DOUBLE-ACTING"));
    }

    #[test]
    fn nested_intervals_are_caught_by_the_furthest_reach() {
        let mut input = healthy();
        // Token 9 writes inside token 7's span: 7 (4..6 ms) contains 9 at 5.5 ms.
        let mut row = next(20, 9, "n3", 50, 50);
        row.committed_us = 1_700_000_000_000_000 + 5500;
        input.ledger.push(row);
        let t = timeline(&input);
        assert_eq!(t.interleavings.len(), 1);
        let (i, j) = t.interleavings[0];
        assert_eq!((t.intervals[i].token, t.intervals[j].token), (7, 9));
    }

    #[test]
    fn rejections_are_counted_per_token() {
        let mut input = healthy();
        input.rejections.push(Rejection {
            id: 1,
            resource: "sequence".into(),
            token: 5,
            max_token: 7,
            holder: "n1".into(),
            max_holder: "n2".into(),
            op: "next".into(),
            reason: "stale-token".into(),
            at_us: 0,
        });
        let t = timeline(&input);
        assert_eq!(t.intervals[0].rejected, 1);
        assert_eq!(t.intervals[1].rejected, 0);
        assert_eq!(check(&input), None);
    }
}
