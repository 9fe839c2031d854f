//! Real-time order over the acknowledged requests of every history (one monotonic clock for all
//! clients on this machine): if A's answer was in before B was sent, then A.seq < B.seq and
//! A.token ≤ B.token. Requests that overlap in time may be answered in either order.
//!
//! O(n log n): sweep B by invoke time while folding in every A that completed strictly before,
//! keeping the highest seq and the highest token among them.

use super::{Ack, CheckInput, Violation};

pub const NAME: &str = "realtime_order";

pub fn check(input: &CheckInput) -> Option<Violation> {
    let mut by_complete: Vec<&Ack> = input.acks.iter().collect();
    by_complete.sort_by_key(|a| (a.complete_ns, a.seq));
    let mut by_invoke: Vec<&Ack> = input.acks.iter().collect();
    by_invoke.sort_by_key(|a| (a.invoke_ns, a.seq));
    let mut i = 0;
    let mut max_seq: Option<&Ack> = None;
    let mut max_token: Option<&Ack> = None;
    for b in by_invoke {
        while i < by_complete.len() && by_complete[i].complete_ns < b.invoke_ns {
            let a = by_complete[i];
            if max_seq.is_none_or(|m| a.seq > m.seq) {
                max_seq = Some(a);
            }
            if max_token.is_none_or(|m| a.token > m.token) {
                max_token = Some(a);
            }
            i += 1;
        }
        if let Some(a) = max_seq.filter(|a| a.seq >= b.seq) {
            return Some(violation(a, b, "seq", a.seq, b.seq));
        }
        if let Some(a) = max_token.filter(|a| a.token > b.token) {
            return Some(violation(a, b, "token", a.token, b.token));
        }
    }
    None
}

fn violation(a: &Ack, b: &Ack, what: &str, va: i64, vb: i64) -> Violation {
    let gap_us = (b.invoke_ns - a.complete_ns) as f64 / 1000.0;
    Violation::new(
        NAME,
        format!(
            "{} got {what} {va} and completed {gap_us:.1} µs before {} was sent, which got {what} {vb}",
            a.source, b.source
        ),
        vec![
            format!("earlier: {}", a.describe()),
            format!("later:   {}", b.describe()),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;

    #[test]
    fn passes_when_later_requests_get_higher_seqs() {
        assert_eq!(check(&healthy()), None);
    }

    #[test]
    fn concurrent_requests_may_be_answered_in_either_order() {
        let mut input = healthy();
        // Overlapping [20, 30] and [25, 26]: the later-invoked one may get the lower seq.
        input.acks.push(ack(8, 7, 11, 20, 30));
        input.acks.push(ack(9, 7, 10, 25, 26));
        assert_eq!(check(&input), None);
    }

    #[test]
    fn a_lower_seq_after_a_completed_request_fails() {
        let mut input = healthy();
        input.acks.push(ack(8, 7, 20, 20, 21));
        input.acks.push(ack(9, 7, 19, 22, 23));
        let v = check(&input).expect("violation");
        assert_eq!(v.invariant, NAME);
        assert_eq!(
            v.message,
            "h#8 got seq 20 and completed 1000.0 µs before h#9 was sent, which got seq 19"
        );
    }

    #[test]
    fn the_same_seq_twice_in_sequence_fails() {
        let mut input = healthy();
        input.acks.push(ack(8, 7, 9, 30, 31));
        let v = check(&input).expect("violation");
        assert!(
            v.message.contains("h#7 got seq 9") && v.message.contains("h#8"),
            "{}",
            v.message
        );
    }

    #[test]
    fn touching_intervals_are_concurrent_but_strictly_later_is_not() {
        let mut input = healthy();
        input.acks.push(ack(8, 7, 21, 20, 22));
        input.acks.push(ack(9, 7, 20, 22, 23)); // invoked exactly when #8 completed
        assert_eq!(check(&input), None);
        input.acks.push(ack(10, 7, 19, 24, 25));
        assert!(check(&input).is_some());
    }

    #[test]
    fn an_older_token_after_a_newer_one_fails() {
        let mut input = healthy();
        // seq rises, but the token goes back: a stale leader answered after the new one.
        input.acks.push(ack(8, 5, 40, 20, 21));
        let v = check(&input).expect("violation");
        assert!(
            v.message.contains("got token 7") && v.message.contains("got token 5"),
            "{}",
            v.message
        );
    }
}
