//! Per resource, the `op='next'` rows' ranges `[seq_lo, seq_hi]` strictly increase in commit
//! order: each starts above the highest seq committed before it. A range that overlaps an
//! earlier one *reuses* IDs; one that starts lower without overlapping *steps back*.

use std::collections::HashMap;

use super::{CheckInput, LedgerRow, Violation};

pub const NAME: &str = "seq_increasing";

pub fn check(input: &CheckInput) -> Option<Violation> {
    // resource -> (rows so far, index of the row holding the highest seq_hi).
    let mut seen: HashMap<&str, (Vec<&LedgerRow>, usize)> = HashMap::new();
    for row in input.ledger.iter().filter(|r| r.op == "next") {
        let (Some(lo), Some(hi)) = (row.seq_lo, row.seq_hi) else {
            return Some(Violation::new(
                NAME,
                format!("pos {} is a 'next' row without a seq range", row.pos),
                vec![row.describe()],
            ));
        };
        if lo > hi {
            return Some(Violation::new(
                NAME,
                format!(
                    "pos {} commits an empty/inverted range [{lo}, {hi}]",
                    row.pos
                ),
                vec![row.describe()],
            ));
        }
        let entry = seen.entry(row.resource.as_str()).or_insert((Vec::new(), 0));
        let (rows, top) = entry;
        if let Some(high) = rows.get(*top) {
            let high_hi = high.seq_hi.unwrap_or(i64::MIN);
            if lo <= high_hi {
                // Reuse if it overlaps any earlier range; name the first such range.
                let overlap = rows.iter().find(|r| {
                    let (rlo, rhi) = (r.seq_lo.unwrap_or(i64::MIN), r.seq_hi.unwrap_or(i64::MIN));
                    lo <= rhi && rlo <= hi
                });
                return Some(match overlap {
                    Some(o) => {
                        let first = lo.max(o.seq_lo.unwrap_or(lo));
                        Violation::new(
                            NAME,
                            format!(
                                "seq {first} reused: pos {} (token {}, holder {}) commits [{lo}, {hi}] but pos {} (token {}, holder {}) already committed [{}, {}]",
                                row.pos,
                                row.token,
                                row.holder,
                                o.pos,
                                o.token,
                                o.holder,
                                o.seq_lo.unwrap_or_default(),
                                o.seq_hi.unwrap_or_default()
                            ),
                            vec![
                                format!("first issued: {}", o.describe()),
                                format!("highest:      {}", high.describe()),
                                format!("reused by:    {}", row.describe()),
                            ],
                        )
                    }
                    None => Violation::new(
                        NAME,
                        format!(
                            "seq stepped back: pos {} (token {}, holder {}) commits [{lo}, {hi}] after pos {} (token {}, holder {}) reached {high_hi}",
                            row.pos, row.token, row.holder, high.pos, high.token, high.holder
                        ),
                        vec![
                            format!("highest:     {}", high.describe()),
                            format!("went back:   {}", row.describe()),
                        ],
                    ),
                });
            }
        }
        rows.push(row);
        *top = rows.len() - 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testkit::*;

    #[test]
    fn passes_on_strictly_increasing_ranges_with_gaps() {
        let mut input = healthy();
        // A gap (burned IDs after an ambiguous commit) is allowed.
        input.ledger.push(next(7, 7, "n2", 20, 25));
        assert_eq!(check(&input), None);
    }

    #[test]
    fn an_overlapping_range_is_reported_as_reuse_naming_both_rows() {
        let mut input = healthy();
        input.ledger.push(next(7, 5, "n1", 6, 8));
        let v = check(&input).expect("violation");
        assert_eq!(v.invariant, NAME);
        assert!(
            v.message.starts_with("seq 6 reused: pos 7 (token 5, holder n1) commits [6, 8] but pos 5 (token 7, holder n2) already committed [5, 6]"),
            "{}",
            v.message
        );
        assert_eq!(v.context.len(), 3);
    }

    #[test]
    fn a_lower_range_in_a_gap_is_a_step_back() {
        let mut input = healthy();
        input.ledger.push(next(7, 7, "n2", 20, 25));
        input.ledger.push(next(8, 7, "n2", 12, 13));
        let v = check(&input).expect("violation");
        assert!(
            v.message.starts_with("seq stepped back: pos 8"),
            "{}",
            v.message
        );
        assert!(v.message.contains("reached 25"), "{}", v.message);
    }

    #[test]
    fn the_same_range_twice_under_one_token_is_reuse() {
        let mut input = healthy();
        input.ledger.push(next(7, 7, "n2", 9, 9));
        let v = check(&input).expect("violation");
        assert!(
            v.message.starts_with("seq 9 reused: pos 7"),
            "{}",
            v.message
        );
    }

    #[test]
    fn inverted_or_missing_ranges_fail() {
        let mut input = healthy();
        input.ledger.push(next(7, 7, "n2", 12, 11));
        assert!(check(&input).unwrap().message.contains("inverted"));
        let mut input = healthy();
        let mut row = next(7, 7, "n2", 12, 12);
        row.seq_lo = None;
        input.ledger.push(row);
        assert!(check(&input)
            .unwrap()
            .message
            .contains("without a seq range"));
    }

    #[test]
    fn claims_and_other_ops_are_not_ranges() {
        let mut input = healthy();
        // A claim reports last_seq (below the next range): not a step back.
        input.ledger.push(claim(7, 9, "n3", 9));
        input.ledger.push(next(8, 9, "n3", 10, 10));
        assert_eq!(check(&input), None);
    }
}
