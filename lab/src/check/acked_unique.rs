//! No seq was acknowledged to two requests, whatever their tokens and whichever histories they
//! are in: the client-side view of "no reuse".

use std::collections::HashMap;

use super::{Ack, CheckInput, Violation};

pub const NAME: &str = "acked_unique";

/// How many acknowledgements repeat a seq acknowledged before: IDs issued twice (or more),
/// where [`check`] names only the first.
pub fn count_repeats(input: &CheckInput) -> usize {
    let mut seqs: Vec<i64> = input.acks.iter().map(|a| a.seq).collect();
    seqs.sort_unstable();
    seqs.windows(2).filter(|w| w[0] == w[1]).count()
}

pub fn check(input: &CheckInput) -> Option<Violation> {
    let mut first: HashMap<i64, &Ack> = HashMap::with_capacity(input.acks.len());
    // Report the pair whose second ack completed earliest.
    let mut order: Vec<&Ack> = input.acks.iter().collect();
    order.sort_by_key(|a| (a.complete_ns, a.invoke_ns));
    for a in order {
        if let Some(f) = first.get(&a.seq) {
            return Some(Violation::new(
                NAME,
                format!(
                    "seq {} acknowledged twice: {} (token {}) and {} (token {})",
                    a.seq, f.source, f.token, a.source, a.token
                ),
                vec![
                    format!("first:  {}", f.describe()),
                    format!("second: {}", a.describe()),
                ],
            ));
        }
        first.insert(a.seq, a);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;

    #[test]
    fn passes_with_distinct_seqs() {
        assert_eq!(check(&healthy()), None);
    }

    #[test]
    fn count_repeats_counts_each_extra_ack() {
        let mut input = healthy();
        assert_eq!(count_repeats(&input), 0);
        input.acks.push(ack(8, 5, 6, 11, 12));
        input.acks.push(ack(9, 5, 6, 11, 12));
        assert_eq!(count_repeats(&input), 2);
    }

    #[test]
    fn the_same_seq_under_two_tokens_fails() {
        let mut input = healthy();
        input.acks.push(ack(8, 5, 6, 11, 12));
        let v = check(&input).expect("violation");
        assert_eq!(v.invariant, NAME);
        assert_eq!(
            v.message,
            "seq 6 acknowledged twice: h#5 (token 7) and h#8 (token 5)"
        );
    }

    #[test]
    fn the_same_seq_from_two_histories_fails_even_when_concurrent() {
        let mut input = healthy();
        let mut dup = ack(8, 7, 9, 13, 15);
        dup.source = "other#0".into();
        input.acks.push(dup);
        let v = check(&input).expect("violation");
        assert!(
            v.message.contains("seq 9 acknowledged twice"),
            "{}",
            v.message
        );
    }
}
