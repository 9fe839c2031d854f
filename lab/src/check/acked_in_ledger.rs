//! Every acknowledged `(token, seq)` is in the ledger exactly once under that token: in one
//! `op='next'` row of that token whose `[seq_lo, seq_hi]` contains it. Missing means a client
//! was handed an ID that was never made durable (or not under the token it was told); twice
//! means the resource committed the same ID twice under one token.

use std::collections::HashMap;

use super::{Ack, CheckInput, LedgerRow, Violation};

pub const NAME: &str = "acked_in_ledger";

/// One token's `next` rows sorted by `seq_lo`, with the running max of `seq_hi`, so the rows
/// containing a seq are found by binary search plus a short backward scan.
struct TokenRanges<'a> {
    rows: Vec<&'a LedgerRow>,
    prefix_max_hi: Vec<i64>,
}

impl<'a> TokenRanges<'a> {
    fn containing(&self, seq: i64) -> Vec<&'a LedgerRow> {
        let end = self
            .rows
            .partition_point(|r| r.seq_lo.unwrap_or(i64::MAX) <= seq);
        let mut out = Vec::new();
        for j in (0..end).rev() {
            if self.prefix_max_hi[j] < seq {
                break;
            }
            if self.rows[j].seq_hi.unwrap_or(i64::MIN) >= seq {
                out.push(self.rows[j]);
            }
        }
        out.reverse();
        out
    }
}

/// How many acknowledged IDs are in no ledger row of their token: acknowledged, then lost (a
/// promoted standby that lacked them), where [`check`] names only the first.
pub fn count_missing(input: &CheckInput) -> usize {
    let index = index(input);
    input
        .acks
        .iter()
        .filter(|a| {
            index
                .get(&a.token)
                .is_none_or(|ix| ix.containing(a.seq).is_empty())
        })
        .count()
}

fn index(input: &CheckInput) -> HashMap<i64, TokenRanges<'_>> {
    let mut by_token: HashMap<i64, Vec<&LedgerRow>> = HashMap::new();
    for r in input.ledger.iter().filter(|r| r.op == "next") {
        by_token.entry(r.token).or_default().push(r);
    }
    by_token
        .into_iter()
        .map(|(t, mut rows)| {
            rows.sort_by_key(|r| (r.seq_lo, r.pos));
            let mut m = i64::MIN;
            let prefix_max_hi = rows
                .iter()
                .map(|r| {
                    m = m.max(r.seq_hi.unwrap_or(i64::MIN));
                    m
                })
                .collect();
            (
                t,
                TokenRanges {
                    rows,
                    prefix_max_hi,
                },
            )
        })
        .collect()
}

pub fn check(input: &CheckInput) -> Option<Violation> {
    let index = index(input);
    let mut order: Vec<&Ack> = input.acks.iter().collect();
    order.sort_by_key(|a| (a.complete_ns, a.invoke_ns));
    for a in order {
        let found = index
            .get(&a.token)
            .map(|ix| ix.containing(a.seq))
            .unwrap_or_default();
        match found.len() {
            1 => {}
            0 => {
                // Context: is it under another token? What does this token's ledger look like?
                let elsewhere: Vec<String> = input
                    .ledger
                    .iter()
                    .filter(|r| {
                        r.op == "next"
                            && r.seq_lo.is_some_and(|lo| lo <= a.seq)
                            && r.seq_hi.is_some_and(|hi| hi >= a.seq)
                    })
                    .take(3)
                    .map(|r| format!("seq {} is under: {}", a.seq, r.describe()))
                    .collect();
                let mut context = vec![format!("ack: {}", a.describe())];
                match index.get(&a.token) {
                    None => context.push(format!("token {} has no 'next' rows at all", a.token)),
                    Some(ix) => context.push(format!(
                        "token {} committed {} ranges, seq {}..={}",
                        a.token,
                        ix.rows.len(),
                        ix.rows.first().and_then(|r| r.seq_lo).unwrap_or_default(),
                        ix.prefix_max_hi.last().copied().unwrap_or_default()
                    )),
                }
                context.extend(elsewhere);
                return Some(Violation::new(
                    NAME,
                    format!(
                        "acknowledged (token {}, seq {}) from {} is not in the ledger under token {}",
                        a.token, a.seq, a.source, a.token
                    ),
                    context,
                ));
            }
            n => {
                let mut context = vec![format!("ack: {}", a.describe())];
                context.extend(found.iter().map(|r| format!("row: {}", r.describe())));
                return Some(Violation::new(
                    NAME,
                    format!(
                        "acknowledged (token {}, seq {}) from {} is in the ledger {n} times under token {} (pos {})",
                        a.token,
                        a.seq,
                        a.source,
                        a.token,
                        found.iter().map(|r| r.pos.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                    context,
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;

    #[test]
    fn passes_when_every_ack_is_in_one_row_of_its_token() {
        assert_eq!(check(&healthy()), None);
    }

    #[test]
    fn count_missing_counts_every_lost_ack() {
        let mut input = healthy();
        assert_eq!(count_missing(&input), 0);
        input.acks.push(ack(1, 999, 6, 11, 12));
        input.acks.push(ack(1, 998, 6, 11, 12));
        assert_eq!(count_missing(&input), 2);
    }

    #[test]
    fn an_ack_missing_from_the_ledger_fails() {
        let mut input = healthy();
        input.acks.push(ack(8, 7, 12, 20, 21));
        let v = check(&input).expect("violation");
        assert_eq!(v.invariant, NAME);
        assert_eq!(
            v.message,
            "acknowledged (token 7, seq 12) from h#8 is not in the ledger under token 7"
        );
        assert!(
            v.context.iter().any(|c| c.contains("2 ranges, seq 5..=9")),
            "{:?}",
            v.context
        );
    }

    #[test]
    fn an_ack_under_the_wrong_token_fails_and_names_where_it_is() {
        let mut input = healthy();
        // The client was told token 5 for seq 6, but seq 6 was committed under token 7.
        input.acks[5].token = 5;
        let v = check(&input).expect("violation");
        assert!(v.message.contains("(token 5, seq 6)"), "{}", v.message);
        assert!(
            v.context.iter().any(|c| c.contains("token 7")),
            "{:?}",
            v.context
        );
    }

    #[test]
    fn an_ack_committed_twice_under_its_token_fails() {
        let mut input = healthy();
        input.ledger.push(next(7, 7, "n2", 6, 8));
        let v = check(&input).expect("violation");
        assert!(
            v.message.contains("(token 7, seq 6)")
                && v.message.contains("2 times")
                && v.message.contains("pos 5, 7"),
            "{}",
            v.message
        );
    }

    #[test]
    fn overlapping_ranges_are_all_found() {
        let mut input = healthy();
        // A long range starting early and a short one: seq 9 is in both.
        input.ledger.push(next(7, 7, "n2", 1, 100));
        let v = check(&input).expect("violation");
        assert!(v.message.contains("2 times"), "{}", v.message);
    }

    #[test]
    fn claims_do_not_count_as_commits() {
        let mut input = healthy();
        input
            .ledger
            .retain(|r| !(r.op == "next" && r.token == 5 && r.seq_lo == Some(4)));
        input.ledger.push(claim(9, 5, "n1", 4));
        let v = check(&input).expect("violation");
        assert!(v.message.contains("seq 4"), "{}", v.message);
    }
}
